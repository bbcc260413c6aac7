"""Step retry inside the allocation on the local cluster (real Slurm, the controller,
the agents and the SPANK plugin's hand-over to ``hyperpod step-retry``).

examples/train_in_place.sbatch runs its training step with ``srun --auto-resume=1``. A
node fault during the step is mended inside the job: the step ends, the node goes out,
a spare is merged into the same job and the step runs again. The job never leaves
RUNNING and its batch script does not start over.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperpod_agent.localcluster import drill
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient
from hyperpod_agent.slurm.hostlist import compress_hostlist

pytestmark = pytest.mark.slurm

SCRIPT = "train_in_place.sbatch"
STARTED = "batch script started on "


@pytest.fixture
def cluster(service_cluster: LocalCluster) -> Iterator[LocalCluster]:
    drill.reset_cluster(service_cluster)
    yield service_cluster
    drill.reset_cluster(service_cluster)


class States:
    """Every state Slurm shows for the job, polled until it ends (bounded)."""

    def __init__(self, cluster: LocalCluster, job_id: int) -> None:
        self.slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
        self.job_id = job_id
        self.seen: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        for _ in range(3000):  # 0.1 s apart: five minutes at most
            job = self.slurm.job(self.job_id)
            if job is not None:
                self.seen.append((job.state, job.restart_count))
                if job.state in drill.ENDED:
                    return
            if self._stop.wait(0.1):
                return

    def stop(self) -> list[tuple[str, int]]:
        self._stop.set()
        self._thread.join(15)
        return self.seen


def running_with_steps(cluster: LocalCluster, job_id: int, out: Path, steps: int) -> list[str]:
    drill.wait_for(
        f"job {job_id} to reach step {steps}",
        90,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= steps,
    )
    return list(drill.job_of(cluster, job_id).nodes)


def events(cluster: LocalCluster, job_id: int) -> list[dict[str, object]]:
    from drill_helpers import Drill

    return [e for e in Drill(cluster).events() if e.get("job_id") == job_id]


def test_xid79_retries_the_step_in_the_same_job_on_a_spare(cluster: LocalCluster) -> None:
    job_id, out = drill.submit_training(
        cluster, steps=30, step_time=0.3, ckpt_every=5, auto_resume=None, script=SCRIPT
    )
    nodes = running_with_steps(cluster, job_id, out, 6)
    states = States(cluster, job_id)
    victim = sorted(nodes)[-1]
    drill.inject_xid(cluster, victim)
    done = drill.wait_job_end(cluster, job_id, timeout=180)
    seen = states.stop()
    text = out.read_text()
    assert done.state == "COMPLETED", text[-2000:]
    assert done.restart_count == 0
    # never back in the queue: RUNNING at every poll until it ended
    ending = next(i for i, (s, _) in enumerate(seen) if s != "RUNNING")
    assert ending > 0 and {s for s, _ in seen[ending:]} <= {"COMPLETING", "COMPLETED"}, seen
    assert {r for _, r in seen} == {0}
    assert text.count(STARTED) == 1  # the batch script's lines before srun ran once
    log = drill.parse_train_log(text)
    assert len(log.attempts) == 2, text[-2000:]
    spare = cluster.spares[0]
    kept = [n for n in nodes if n != victim]
    assert log.attempts[1].nodes == compress_hostlist([*kept, spare])
    assert log.attempts[1].resumed_from is not None and log.attempts[1].resumed_from >= 5
    assert log.done_step == 30
    assert f"rendezvous {sorted([*kept, spare])[0]}" in text
    reason = drill.job_of(cluster, job_id)  # still in view; the node is what matters
    assert reason.job_id == job_id
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    assert slurm.node(victim).reason.startswith("hyperpod:replace gpu3 xid79"), slurm.node(victim)
    kinds = [e["kind"] for e in events(cluster, job_id)]
    assert "step_end" in kinds and "step_retry_planned" in kinds
    assert "requeue" not in kinds


def test_on_a_busy_cluster_the_job_runs_again_before_a_waiting_job_starts(
    cluster: LocalCluster,
) -> None:
    job_id, out = drill.submit_training(
        cluster, steps=24, step_time=0.3, ckpt_every=5, auto_resume=None, script=SCRIPT
    )
    nodes = running_with_steps(cluster, job_id, out, 4)
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    # A job that wants more than the free nodes: it waits, and would take the nodes a
    # requeued job gives up (and the spare, were it free for anyone).
    free = len(cluster.nodes) - len(nodes)
    res = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--exclusive",
            f"-N{free + 1}",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 1",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=cluster.env,
        check=True,
    )
    waiting = int(res.stdout.strip().split(";")[0])
    drill.wait_for(
        "the other job to wait", 30, lambda: (j := slurm.job(waiting)) and j.state == "PENDING"
    )
    victim = sorted(nodes)[-1]
    drill.inject_xid(cluster, victim)
    log = drill.wait_for(
        "the step to run again",
        120,
        lambda: len((tl := drill.parse_train_log(out.read_text())).attempts) >= 2 and tl,
        interval=0.3,
    )
    again_at = log.attempts[1].started_at
    other = slurm.job(waiting)
    assert other is not None
    assert other.state == "PENDING" or (
        other.start_time is not None and other.start_time.timestamp() > again_at
    ), (other, again_at)
    done = drill.wait_job_end(cluster, job_id, timeout=180)
    assert done.state == "COMPLETED" and done.restart_count == 0
    slurm.cancel(waiting)
