"""A hostile user against hang detection, on the service cluster (docs/progress.md,
"What the agent and the controller trust").

Two real unprivileged users (tests/integration/hostile.py). The victim trains: one job
(``real``) on node1 and node2 records its progress from before the attack. The attacker
then runs a job of their own on all four nodes whose tasks forge progress records:

- into the victim's job directory (theirs on the nodes it runs on, so the attacker
  cannot);
- a flood of 2,000 job directories on every node, then the next five job ids (made
  last, so a listing of the root shows them first), each with a record of a dead
  process (or of the forger itself), 20 step times, the last step a second ago and
  ``hang_factor = hang_min_s = 1e-300``: the victim's next job (``squatted``, on node3
  and node4) finds its directory taken and records nothing, while the forged records
  say it hung at once, node3's rank "gone";
- into their own job's directory: a rank "behind" the others on node2 with the same
  settings, to have node2 rebooted as the clear suspect of their own hang (their hang
  is declared: their records count for their own job, but name node2 only).

For the whole attack neither victim job is declared hung, requeued or cancelled, no node
is rebooted or drained, the reconcile passes go on, and the agents say why they refused
the forged records. Then a rank of the victim's ``real`` job is frozen (SIGSTOP), as in
test_hang_drills.py, on either of its nodes (drawn at random, its batch host included:
seeded, the seed and the node printed): the hang is declared within the usual bound, its
suspect named, and handled as a hang of an auto-resume job is (the job requeued, the
frozen node taken out for a reboot), while the reconcile passes go on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drill_helpers import Dice, fresh_drill, kept_passing, metric, passes, taken_out
from hostile import User, attacker, user_env, user_venv, victim

from hyperpod_agent.localcluster import drill
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
DETECT_S = 60.0  # the usual bound on a hang's declaration (test_hang_drills.py)
ATTACK_S = 30.0  # how long the attack is watched before the real hang
FLOOD = 2000

FORGER = r'''
"""A hostile user's job task: forged progress records (test_hostile_progress.py)."""
import os
import subprocess
import sys
import time
from pathlib import Path

from hyperpod_agent.progress import format as pf

TINY = 1e-300


def encode(pid, job, rank, step, step_at, created):
    buf = bytearray(pf.SIZE)
    pf.HEADER.pack_into(buf, 0, pf.MAGIC, pf.VERSION, 2)
    pf.IDENTITY.pack_into(buf, pf.IDENTITY_OFFSET, pid, job, rank)
    pf.STATE.pack_into(
        buf, pf.STATE_OFFSET, 0, created, step, step_at, 0.0, b"", TINY, TINY
    )
    for i in range(20):
        pf.DURATION.pack_into(buf, pf.RING_OFFSET + 4 * i, 1.0)
    pf.TOTAL.pack_into(buf, pf.TOTAL_OFFSET, 20)
    return bytes(buf)


def put(root, job, rank, data):
    d = root / str(job)
    try:
        d.mkdir(mode=0o755)
    except FileExistsError:
        pass
    tmp = d / f".{rank}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, d / f"{rank}{pf.SUFFIX}")


victim_job, flood, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
root = Path(os.environ["HYPERPOD_PROGRESS_DIR"])
me, rank = int(os.environ["SLURM_JOB_ID"]), int(os.environ["SLURM_PROCID"])
child = subprocess.Popen(["true"])
child.wait()
dead = child.pid  # no process has it now
started = now = time.time()
# A dead process on even ranks' nodes (node1, node3), the forger itself on the others.
named = dead if rank % 2 == 0 else os.getpid()
try:
    put(root, victim_job, 9, encode(dead, victim_job, 9, 100, now - 1, now - 60))
    print(f"rank {rank}: victim's directory written", flush=True)
except OSError as exc:
    print(f"rank {rank}: victim's directory refused: {exc.strerror}", flush=True)
for job in range(me + 6, me + 6 + flood):
    put(root, job, rank, encode(named, job, rank, 100, now - 1, now - 60))
print(f"rank {rank}: flooded", flush=True)
deadline, ready = started + seconds, False
while time.time() < deadline:
    now = time.time()
    # The next job ids, made last (a listing shows them first): last step kept fresh.
    for job in range(me + 1, me + 6):
        put(root, job, rank, encode(named, job, rank, 100, now - 1, now - 60))
    # Their own job: node2's rank "behind" the others, to have node2 taken out.
    put(root, me, rank, encode(os.getpid(), me, rank, 5 if rank == 1 else 100, started, started))
    if not ready:
        print(f"rank {rank}: squatting", flush=True)
        ready = True
    time.sleep(0.5)
'''


@pytest.fixture
def cluster(service_cluster: LocalCluster) -> Iterator[LocalCluster]:
    # A controller on empty state, the cluster restored before and after: the real hang
    # is a first fault on whichever node is drawn (no history of earlier drills).
    for fresh in fresh_drill(service_cluster):
        yield fresh.cluster


@pytest.fixture(scope="module")
def users() -> tuple[User, User, Path]:
    return attacker(), victim(), user_venv(REPO)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may read, for the forger's script."""
    path = Path(tempfile.mkdtemp(prefix="hp-hostile-progress-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def hyperpod(cluster: LocalCluster, *args: str) -> Any:
    res = subprocess.run(
        [sys.executable, "-m", "hyperpod_agent", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "HYPERPOD_LOCAL_CLUSTER_DIR": str(cluster.dir)},
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def events(cluster: LocalCluster, after: int = 0) -> list[dict[str, Any]]:
    """The controller's events newer than event ``after`` (it keeps earlier tests')."""
    return [e for e in hyperpod(cluster, "events", "--limit", "1000") if int(e["id"]) > after]


def steps_of(out: Path) -> int:
    return drill.parse_train_log(out.read_text()).last_step if out.exists() else 0


def sbatch(user: User, env: dict[str, str], argv: list[str]) -> int:
    res = user.run(["sbatch", "--parsable", *argv], env)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def train(user: User, env: dict[str, str], out: Path, nodes: str, sync: Path | None = None) -> int:
    """The victim's training job (examples/train.sbatch) on ``nodes``, auto-resume."""
    args = ["--steps", "5000", "--step-time", "0.3", "--ckpt-every", "100"]
    if sync is not None:
        args += ["--sync", str(sync)]
    return sbatch(
        user,
        {
            **env,
            "TRAIN_SCRIPT": str(EXAMPLES / "train_toy.py"),
            # Its own, looser floor: two loaded cores must not make a slow step a hang.
            "HYPERPOD_HANG_MIN_S": "15",
        },
        ["-o", str(out), "-w", nodes, "--auto-resume=1", str(EXAMPLES / "train.sbatch"), *args],
    )


def cancel_all(cluster: LocalCluster, jobs: list[int]) -> None:
    for job in jobs:
        subprocess.run(
            ["scancel", str(job)], env=cluster.env, capture_output=True, timeout=30, check=False
        )


def remove_theirs(cluster: LocalCluster, uid: int) -> None:
    """The attacker's directories under every node's progress root (the flood)."""
    for node_root in cluster.shape.progress_root.iterdir():
        for entry in node_root.iterdir():
            try:
                theirs = entry.lstat().st_uid == uid
            except FileNotFoundError:  # a job's epilog or the janitor was first
                continue
            if theirs:
                shutil.rmtree(entry, ignore_errors=True)


def test_forged_progress_changes_nothing_and_a_real_hang_is_still_declared(
    cluster: LocalCluster, users: tuple[User, User, Path], shared_dir: Path
) -> None:
    dice = Dice("hostile progress")
    evil, good, venv_bin = users
    env = user_env(cluster.env, venv_bin)  # what either user's shell on the cluster has
    out = cluster.dir / "out"
    stamp = time.time_ns()
    sync = out / f"sync-victim-{stamp}"
    sync.mkdir()
    os.chown(sync, good.uid, good.gid)
    forger = shared_dir / "forger.py"
    forger.write_text(FORGER)
    forger.chmod(0o644)
    controller = cluster.services.controller_url
    before = max((int(e["id"]) for e in events(cluster)), default=0)
    jobs: list[int] = []
    try:
        # The victim's job that records its progress, before any attack.
        real_out = out / f"victim-real-{stamp}.out"
        real = train(good, env, real_out, "node1,node2", sync)
        jobs.append(real)
        drill.wait_for(
            "the victim's job stepping",
            90,
            lambda: (
                real_out.exists() and drill.parse_train_log(real_out.read_text()).last_step >= 15
            ),
            0.5,
        )
        assert set(drill.rank_records(cluster, real)) == {"node1", "node2"}

        # The attacker's job on every node: the forger in each task.
        evil_out = out / f"attacker-{stamp}.out"
        script = f"srun python3 {forger} {real} {FLOOD} 600"
        forging = sbatch(
            evil,
            env,
            ["-o", str(evil_out), "-N", "4", "-w", "node1,node2,node3,node4",
             "--ntasks-per-node=1", "--auto-resume=1", "--wrap", script],
        )  # fmt: skip
        jobs.append(forging)
        drill.wait_for(
            "every forger flooding and squatting",
            90,
            lambda: evil_out.exists() and evil_out.read_text().count("squatting") == 4,
            0.5,
        )
        said = evil_out.read_text()
        # On node1 and node2, where the victim's job runs, its directory is theirs; on
        # node3 and node4 it runs nowhere and the attacker may take the name.
        for rank in (0, 1):
            assert f"rank {rank}: victim's directory refused" in said, said
        for node in cluster.nodes:
            names = {p.name for p in (cluster.shape.progress_root / node).iterdir()}
            assert {str(j) for j in range(forging + 1, forging + 6 + FLOOD)} <= names

        # The victim's next job: its directory on node3 and node4 is the attacker's.
        squatted_out = out / f"victim-squatted-{stamp}.out"
        squatted = train(good, env, squatted_out, "node3,node4")
        jobs.append(squatted)
        assert forging < squatted <= forging + 5, (forging, squatted)
        drill.wait_for(
            "the squatted job running",
            60,
            lambda: drill.job_of(cluster, squatted).state == "RUNNING",
            0.5,
        )

        # The attack, watched.
        passed, watched_from = passes(controller), time.monotonic()
        while time.monotonic() - watched_from < ATTACK_S:
            for job in (real, squatted):
                now = drill.job_of(cluster, job)
                assert now.state == "RUNNING" and now.restart_count == 0, now
            seen = events(cluster, before)
            hung = [e for e in seen if e["kind"] == "hang" and e.get("job_id") in (real, squatted)]
            assert hung == [], hung
            taken = [e for e in seen if e["kind"] in ("reboot", "drain", "replace", "cancel")]
            assert taken == [], taken
            time.sleep(2)
        for node in SlurmClient(cluster.slurm_conf, timeout=10).list_nodes():
            if node.name in cluster.nodes:
                rebooting = any(f.startswith("REBOOT") for f in node.flags)
                assert not node.drained and not rebooting, node
        kept_passing(controller, passed, watched_from)
        # The attacker's records count for their own job (its hang is theirs), and name
        # node2, whose rank they say is behind; only that, never taking it out.
        theirs = [e for e in seen if e["kind"] == "hang" and e.get("job_id") == forging]
        assert theirs and "node2: rank 1 at step 5 < 100" in theirs[0]["message"], theirs
        # The agents saw the forged records of the squatted job and refused them.
        services = cluster.services
        refused = {
            node: {
                reason: metric(
                    f"http://127.0.0.1:{services.metrics_port(node)}",
                    "hyperpod_agent_progress_skipped_total",
                    f'reason="{reason}"',
                )
                for reason in ("unverified", "not_in_job")
            }
            for node in ("node3", "node4")
        }
        assert refused["node3"]["unverified"] >= 1, refused
        assert refused["node4"]["not_in_job"] >= 1, refused
        squatted_said = squatted_out.read_text() if squatted_out.exists() else ""
        assert "belongs to uid" in squatted_said, squatted_said  # its records were off

        # A real hang during the attack: a rank of the victim's job frozen. Only the
        # real job's nodes can take it (the squatted job records nothing, by design of
        # the attack); either of them, its batch host included. Its placement is fixed:
        # the forgery's roles on node3 and node4 (a dead process, a live one) hang on it.
        real_job = drill.job_of(cluster, real)
        suspect = dice.node("frozen rank's node", real_job.nodes)
        print(f"  the real job's batch host: {real_job.batch_host}")
        frozen = drill.freeze_ranks(cluster, real, suspect)
        frozen_at = time.monotonic()
        try:
            [hang] = drill.wait_for(
                "the real hang declared",
                DETECT_S,
                lambda: [
                    e
                    for e in events(cluster, before)
                    if e["kind"] == "hang" and e.get("job_id") == real
                ],
                0.5,
            )
            declared = time.monotonic() - frozen_at
            assert declared < DETECT_S
            assert f"suspect {suspect} ({suspect}: rank" in hang["message"], hang
            assert "state T" in hang["message"], hang
            # Handled as a hang of an auto-resume job is (test_hang_drills.py): the job
            # requeued, and the node whose agent saw the stopped rank taken out for a
            # reboot (which waits for the attacker's job there: ASAP).
            slurm = SlurmClient(cluster.slurm_conf, timeout=10)

            def out_for_the_hang() -> bool:
                node = slurm.node(suspect)
                return taken_out(node) and node.reason.startswith(f"hyperpod:reboot job{real} hang")

            drill.wait_for(
                f"{suspect} taken out for the hang",
                max(0.5, DETECT_S - (time.monotonic() - frozen_at)),
                out_for_the_hang,
                0.3,
            )
            out_after = time.monotonic() - frozen_at

            def recovered() -> list[dict[str, Any]]:
                seen = events(cluster, before)
                rebooted = any(
                    e["kind"] == "reboot"
                    and e.get("node") == suspect
                    and f"job{real} hang" in e["message"]
                    for e in seen
                )
                requeued = any(e["kind"] == "requeue" and e.get("job_id") == real for e in seen)
                return seen if rebooted and requeued else []

            handled = drill.wait_for("the hang's reboot and requeue events", 10, recovered, 0.5)
            acted = {e["kind"] for e in handled if e.get("job_id") == squatted}
            assert not acted & {"hang", "requeue", "cancel"}, acted
            # the reconcile loop went on through the attack and the hang, every pass well
            kept_passing(controller, passed, watched_from)
            print(
                f"  hang declared {declared:.1f} s after the freeze, {suspect} out "
                f"{out_after:.1f} s after it"
            )
        finally:
            for pid in frozen:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
    finally:
        cancel_all(cluster, jobs)
        remove_theirs(cluster, evil.uid)
