"""A hostile user takes the names of the next jobs' directories; the victim's job runs on.

On a node every user shares the progress root and the checkpoint memory root (mode 1777),
and on the local cluster the checkpoint root too (mode 1777, as a site that lets users
make their own directories there has it). Job ids are predictable, so the attacker makes
the directories of the next jobs first, on every node and in all three roots, and plants
a progress record in each of their progress directories. Then the victim submits a
training job that records its progress and saves a checkpoint.

The job must run to completion unaffected: the SPANK plugin leaves the attacker's
directories alone (never adopted, chowned or removed, also not by the epilog), tells the
job what it goes without, and gives it a checkpoint directory named after its job key,
which the attacker could not know. Nothing of the victim's lands in the attacker's
directories, and nothing of the attacker's passes for the victim's records.

It runs on the service cluster (the controller and an agent per node): with the
directories squatted, a real XID 79 hits a node drawn at random (seeded; the seed and
the node are printed) and is handled in its usual time while the victim's job runs, and
every reconcile pass of the whole attack ends well.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from drill_helpers import (
    DETECT_S,
    REBOOT_S,
    Dice,
    Drill,
    RealFault,
    fresh_drill,
    kept_passing,
    passes,
    wait_for,
)
from hostile import User, attacker, user_env, user_venv, victim

from hyperpod_agent.localcluster.cluster import LocalCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
AHEAD = 5  # job ids the attacker takes
TIMEOUT_S = 120.0
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}

# As the attacker: every root's directory of every job id given, and a progress record
# in each progress directory that says it is rank 0 of that job.
SQUAT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from hyperpod_agent.progress import record

    progress, memory, ckpt = (a.split(":") for a in sys.argv[1:4])
    for job in sys.argv[4].split(","):
        for root in progress + memory + ckpt:
            Path(root, job).mkdir(mode=0o755)
        for root in progress:
            Path(root, job, "0.prog").write_bytes(record.initial(int(job), 0, 0.0, 0.0))
    """
)

# The victim's training step: progress every step, a checkpoint at the end.
TRAIN = textwrap.dedent(
    """
    import json, os
    import numpy as np
    from hyperpod_agent import progress
    from hyperpod_agent.checkpoint import Checkpointer

    for step in range(1, 6):
        progress.step(step)
    ckpt = Checkpointer.from_env()
    ckpt.save(5, {"w": np.arange(1024, dtype=np.float32)})
    ckpt.close()
    print("RESULT " + json.dumps({
        "job": os.environ["SLURM_JOB_ID"],
        "node": os.environ["SLURMD_NODENAME"],
        "progress": None if progress.path() is None else str(progress.path()),
        "checkpoint_dir": os.environ.get("HYPERPOD_CHECKPOINT_DIR"),
        "memory_tier": ckpt.memory_dir is not None,
    }), flush=True)
    """
)


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)


def _next_job_id(env: dict[str, str]) -> int:
    """What Slurm hands out next (nothing else submits on this cluster meanwhile)."""
    res = _run(["sbatch", "--parsable", "--hold", "-N1", "--wrap", "true"], env)
    assert res.returncode == 0, res.stderr
    held = res.stdout.strip().split(";")[0]
    _run(["scancel", held], env)
    return int(held) + 1


def _state(job: str, env: dict[str, str]) -> str:
    res = _run(["scontrol", "show", "job", "-o", job], env)
    m = re.search(r"(?:^| )JobState=(\S+)", res.stdout)
    return m.group(1) if m else "UNKNOWN"


def _wait_done(job: str, env: dict[str, str]) -> str:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        state = _state(job, env)
        if state in ENDED:
            return state
        time.sleep(0.3)
    raise AssertionError(f"job {job} did not finish within {TIMEOUT_S} s")


def _tree(d: Path) -> dict[str, tuple[int, int]]:
    """Every entry below and including ``d``: path -> (owner, mode), nothing followed."""
    out = {}
    for p in [d, *d.rglob("*")]:
        st = p.lstat()
        out[str(p)] = (st.st_uid, st.st_mode)
    return out


@pytest.fixture
def drill(service_cluster: LocalCluster) -> Iterator[Drill]:
    yield from fresh_drill(service_cluster)


@pytest.fixture
def squatted(drill: Drill) -> Iterator[list[Path]]:
    """The attacker's directories (removed at the end, so later jobs run as usual)."""
    made: list[Path] = []
    yield made
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def test_squatted_directories_cost_the_victims_job_nothing_but_features(
    drill: Drill, squatted: list[Path], shared_tmp: Path
) -> None:
    dice = Dice("hostile job directories")
    local_cluster = drill.cluster
    env = local_cluster.env
    shape = local_cluster.shape
    bindir = user_venv(REPO)
    bad, good = attacker(), victim()
    url = drill.services.controller_url
    before_passes, attack_from = passes(url), time.monotonic()

    # The attacker takes the next AHEAD job ids in every root of every node.
    first = _next_job_id(env)
    ids = [str(first + k) for k in range(AHEAD)]
    nodes = shape.all_names
    progress_roots = [shape.progress_root / n for n in nodes]
    memory_roots = [shape.memory_root / n for n in nodes]
    ckpt_root = local_cluster.dir / "checkpoints"
    script = shared_tmp / "squat.py"
    script.write_text(SQUAT)
    args = [":".join(map(str, r)) for r in (progress_roots, memory_roots, [ckpt_root])]
    res = bad.run(
        [str(bindir / "python"), str(script), *args, ",".join(ids)], user_env(env, bindir)
    )
    squatted += [r / j for r in progress_roots + memory_roots + [ckpt_root] for j in ids]
    assert res.returncode == 0, res.stderr
    before = {str(d): _tree(d) for d in squatted}
    assert all(owner == bad.uid for t in before.values() for owner, _ in t.values())

    # A real fault with the directories squatted: XID 79 on any node in service (every
    # node's roots are squatted alike). Injected before the victim's job is submitted,
    # handled while it runs: the job cannot be placed on the node going out. Not under
    # the victim's job: that is an auto-resume job, which the fault would rightly
    # requeue onto a spare, and "runs to completion unaffected" would say nothing.
    # No spare: out of service, a fault there is the pool's story.
    xid = RealFault(drill, dice.node("XID 79 node", drill.nodes))
    try:
        xid.inject()
        took = xid.taken_out(DETECT_S)

        # The victim's training job: progress through hyperpod_agent.progress, a checkpoint.
        job, output = _submit(good, local_cluster, bindir, shared_tmp)
        assert job in ids, (
            f"job {job} is not one the attacker took ({ids}): the drill proves nothing"
        )
        state = _wait_done(job, env)
        assert state == "COMPLETED", _run(["scontrol", "show", "job", job], env).stdout
        xid.events()
        back = xid.back(REBOOT_S)
        # two more passes with the directories still squatted and the job's done
        ran = passes(url).get("ok", 0)
        wait_for("two more passes", lambda: passes(url).get("ok", 0) >= ran + 2, 30, 0.5)
    finally:
        xid.stop()
    print(f"  XID node out {took:.1f} s after the XID, back {back:.1f} s after the job ended")
    # the fault was handled in its usual time, and every pass of the attack ended well
    assert took < DETECT_S
    kept_passing(url, before_passes, attack_from)
    out = output.read_text()
    result = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])

    # It ran to completion and saved its checkpoint, in a directory of its own.
    key_dir = Path(result["checkpoint_dir"])
    assert key_dir.parent == ckpt_root and re.fullmatch(rf"{job}\.[0-9a-f]{{32}}", key_dir.name)
    saved = _tree(key_dir)
    assert saved[str(key_dir)][1] & 0o7777 == 0o700
    assert len(saved) > 1 and all(owner == good.uid for owner, _ in saved.values())
    # What it went without is said in its stderr, one line per feature and reason.
    node = result["node"]
    assert node != xid.node, "the victim's job ran on the node going out for its XID"
    for what, path in [
        ("progress directory", shape.progress_root / node / job),
        ("memory tier directory", shape.memory_root / node / job),
        ("checkpoint directory", ckpt_root / job),
    ]:
        assert f"couldn't make {what} {path}: belongs to uid {bad.uid}, not to the job's " in out
    assert result["progress"] is None and result["memory_tier"] is False

    # The attacker's directories: exactly as they were (also after the job's epilog),
    # nothing of the victim's in them, and their record is still only the attacker's.
    after = {str(d): _tree(d) for d in squatted}
    assert after == before
    assert not any(owner == good.uid for t in after.values() for owner, _ in t.values())


def _submit(user: User, cluster: LocalCluster, bindir: Path, shared_tmp: Path) -> tuple[str, Path]:
    """sbatch as ``user``: one task running TRAIN with the user venv's python. Returns
    the job id and its output file."""
    train = shared_tmp / "train.py"
    train.write_text(TRAIN)
    batch = shared_tmp / "train.sbatch"
    batch.write_text(f"#!/bin/sh\nsrun {bindir / 'python'} {train}\n")
    out = cluster.dir / "out" / uuid.uuid4().hex
    out.mkdir()
    os.chown(out, user.uid, user.gid)
    res = user.run(
        ["sbatch", "--parsable", "-N1", "--auto-resume=1", "-o", str(out / "%j.out"), str(batch)],
        user_env(cluster.env, bindir),
    )
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    return job, out / f"{job}.out"
