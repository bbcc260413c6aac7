"""A 2-node Slurm job saves with peer replication; restores come from the peer, then disk.

The job runs one task per node through ``srun``; each task hosts its node's replica server
(HYPERPOD_CHECKPOINT_SERVE=1). On one machine every node's "/dev/shm" is a directory of its
own, chosen by node name, so wiping one node's memory tier is deleting one directory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slurm

PEER_PORTS = (24847, 24848)

TASK = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    import numpy as np
    from hyperpod_agent.checkpoint import Checkpointer

    mode, base = sys.argv[1], Path(sys.argv[2])
    node = os.environ["SLURMD_NODENAME"]
    os.environ["HYPERPOD_CHECKPOINT_MEMORY_DIR"] = str(base / "shm" / node)
    ckpt = Checkpointer.from_env()

    def state(rank, step):
        return {"w": np.full((256, 256), rank * 1000 + step, np.float32), "step": step}

    def barrier(name):
        # Keep this task's replica server up until every task is done with it.
        (base / f"{name}-{ckpt.rank}").touch()
        deadline = time.monotonic() + 60
        while not all((base / f"{name}-{r}").exists() for r in range(ckpt.world_size)):
            if time.monotonic() > deadline:
                sys.exit("barrier timed out")
            time.sleep(0.05)

    out = {"rank": ckpt.rank, "node": node}
    if mode == "save":
        for step in (1, 2, 3):
            ckpt.save(step, state(ckpt.rank, step))
        ckpt.wait()
    else:
        step, value = ckpt.load_latest(state(ckpt.rank, 0))
        info = ckpt.last_restore
        out.update(step=step, tier=info.tier, source=info.source,
                   exact=bool(np.array_equal(value["w"], state(ckpt.rank, step)["w"])))
    barrier(mode + "-" + sys.argv[3])
    print("RESULT " + json.dumps(out), flush=True)
    ckpt.close()
    """
)


def _run_job(cluster: Any, base: Path, mode: str, tag: str) -> list[dict[str, Any]]:
    nodes = cluster.nodes[:2]
    peers = ",".join(f"{n}=127.0.0.1:{p}" for n, p in zip(nodes, PEER_PORTS, strict=True))
    out = base / f"{tag}.out"
    script = base / f"{tag}.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"export HYPERPOD_CHECKPOINT_DIR={base / 'persistent'}\n"
        f"export HYPERPOD_CHECKPOINT_PEERS={peers}\n"
        "export HYPERPOD_CHECKPOINT_SERVE=1\n"
        f"export PYTHONPATH={Path(__file__).parents[2]}\n"
        f"srun -N2 --ntasks-per-node=1 {sys.executable} {base / 'task.py'} {mode} {base} {tag}\n"
    )
    job = (
        subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-N2",
                "--ntasks-per-node=1",
                "-w",
                ",".join(nodes),
                "-o",
                str(out),
                "-t",
                "5",
                str(script),
            ],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        .stdout.strip()
        .split(";")[0]
    )
    deadline = time.monotonic() + 120
    state = ""
    while time.monotonic() < deadline:
        show = subprocess.run(
            ["scontrol", "show", "job", job],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        state = show.split("JobState=")[1].split()[0] if "JobState=" in show else "GONE"
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE"):
            break
        time.sleep(0.5)
    text = out.read_text() if out.exists() else ""
    if state not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE"):
        subprocess.run(["scancel", job], env=cluster.env, capture_output=True, timeout=30)
    assert state == "COMPLETED", f"job {job} ended {state}: {text[-2000:]}"
    results = [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 2, text[-2000:]
    return sorted(results, key=lambda r: r["rank"])


def test_two_node_job_restores_from_peer_then_persistent(
    local_cluster: Any, tmp_path: Path
) -> None:
    local_cluster.wait_idle(local_cluster.nodes[:2], timeout=30)  # fail fast on a down node
    base = Path("/var/tmp/hp-ckpt") / tmp_path.name
    base.mkdir(parents=True, exist_ok=True)
    try:
        (base / "task.py").write_text(TASK)
        saved = _run_job(local_cluster, base, "save", "save")
        assert [r["rank"] for r in saved] == [0, 1]
        node1, node2 = local_cluster.nodes[:2]

        shutil.rmtree(base / "shm" / node1)  # node1 lost its memory (e.g. replaced)
        got = _run_job(local_cluster, base, "load", "peer")
        assert got[0]["step"] == got[1]["step"] == 3
        assert (got[0]["tier"], got[0]["source"]) == ("peer", node2)
        assert got[1]["tier"] == "memory"
        assert all(r["exact"] for r in got)

        shutil.rmtree(base / "shm")  # every node lost its memory
        got = _run_job(local_cluster, base, "load", "disk")
        assert [r["tier"] for r in got] == ["persistent", "persistent"]
        assert all(r["step"] == 3 and r["exact"] for r in got)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---- the job key (SPANK plugin + library): a job id handed out again ----------------------

KEYED = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from hyperpod_agent.checkpoint import Checkpointer, CheckpointError

    try:
        ckpt = Checkpointer.from_env()
    except CheckpointError as exc:
        print("REFUSED " + str(exc), flush=True)
        sys.exit(3)
    got = ckpt.load_latest()
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    print(f"RESUMED {got[0] if got else None} restart={restart}", flush=True)
    ckpt.save(10 + restart, {"w": np.full(4, float(restart))}).wait()
    ckpt.close()
    """
)


def _keyed_job(cluster: Any, base: Path, *sbatch: str, wait_for_requeue: bool = False) -> str:
    """Submit a job whose task restores, reports and saves in <checkpoint_root>/<jobid>
    (the plugin's directory, with the job's key)."""
    (base / "keyed.py").write_text(KEYED)
    script = base / "keyed.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"export HYPERPOD_CHECKPOINT_MEMORY_DIR={base / 'shm'}\n"
        f"export PYTHONPATH={Path(__file__).parents[2]}\n"
        f"srun -N1 {sys.executable} {base / 'keyed.py'} || exit $?\n"
        + ('[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || sleep 120\n' if wait_for_requeue else "")
    )
    res = subprocess.run(
        ["sbatch", "--parsable", "--auto-resume=1", "-N1", "-t", "5", "--open-mode=append"]
        + ["-o", str(base / "out"), *sbatch, str(script)],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return res.stdout.strip().split(";")[0]


def _job_state(cluster: Any, job: str) -> str:
    show = subprocess.run(
        ["scontrol", "show", "job", job],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return show.split("JobState=")[1].split()[0] if "JobState=" in show else "GONE"


def _until(what: str, cond: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.5)


_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE")


def test_a_reused_job_id_does_not_restore_its_predecessors_checkpoints(
    local_cluster: Any, tmp_path: Path
) -> None:
    import numpy as np

    from hyperpod_agent.checkpoint import Checkpointer

    base = Path("/var/tmp/hp-ckpt") / tmp_path.name
    base.mkdir(parents=True, exist_ok=True)
    job = _keyed_job(local_cluster, base, "--hold")  # held: its id is known before it runs
    old = Path(local_cluster.dir) / "checkpoints" / job
    try:
        # The job that had this id before Slurm's state was reset left its checkpoints here
        # (made under its own key), and its memory tier.
        prev = Checkpointer(old, memory_dir=base / "shm", job_key="0" * 32)
        prev.save(5, {"w": np.zeros(4)}).wait()
        prev.close()
        before = {
            p: p.read_bytes() for p in (*old.rglob("*"), *(base / "shm").rglob("*")) if p.is_file()
        }
        subprocess.run(["scontrol", "release", job], env=local_cluster.env, check=True, timeout=30)
        _until("the job ends", lambda: _job_state(local_cluster, job) in _ENDED)
        assert _job_state(local_cluster, job) == "FAILED"
        text = (base / "out").read_text()
        assert (
            f"REFUSED {old}/run.json: these checkpoints belong to another job (job key "
            f"{'0' * 32}), not to this one (job key " in text
        ), text
        assert "RESUMED" not in text
        after = {
            p: p.read_bytes() for p in (*old.rglob("*"), *(base / "shm").rglob("*")) if p.is_file()
        }
        assert after == before, "nothing overwritten"
    finally:
        subprocess.run(["scancel", job], env=local_cluster.env, capture_output=True, timeout=30)
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


def test_a_requeued_job_restores_with_its_own_job_key(local_cluster: Any, tmp_path: Path) -> None:
    base = Path("/var/tmp/hp-ckpt") / tmp_path.name
    base.mkdir(parents=True, exist_ok=True)
    job = _keyed_job(local_cluster, base, "--requeue", wait_for_requeue=True)
    old = Path(local_cluster.dir) / "checkpoints" / job
    out = base / "out"
    try:
        _until("the first run saves", lambda: out.exists() and "restart=0" in out.read_text())
        _until("step 10 is durable", lambda: (old / "step-0000000010" / "step.json").exists())
        subprocess.run(["scontrol", "requeue", job], env=local_cluster.env, check=True, timeout=30)
        _until("the requeued run ends", lambda: "restart=1" in out.read_text())
        _until("the job ends", lambda: _job_state(local_cluster, job) in _ENDED)
        lines = [x for x in out.read_text().splitlines() if x.startswith(("RESUMED", "REFUSED"))]
        assert lines == ["RESUMED None restart=0", "RESUMED 10 restart=1"], out.read_text()
        assert _job_state(local_cluster, job) == "COMPLETED"
    finally:
        subprocess.run(["scancel", job], env=local_cluster.env, capture_output=True, timeout=30)
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
