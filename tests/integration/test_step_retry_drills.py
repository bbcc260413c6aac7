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
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from hyperpod_agent.localcluster import drill, reset
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient
from hyperpod_agent.slurm.hostlist import compress_hostlist, expand_hostlist

pytestmark = pytest.mark.slurm

SCRIPT = "train_in_place.sbatch"
STARTED = "batch script started on "


@pytest.fixture
def cluster(service_cluster: LocalCluster) -> Iterator[LocalCluster]:
    reset.reset_cluster(service_cluster)
    spares_ready(service_cluster)
    yield service_cluster
    reset.reset_cluster(service_cluster)


def spares_ready(cluster: LocalCluster) -> None:
    """The local cluster names a deep-check suite, so the spare gate is on as shipped:
    a spare back in the pool stands in only once it passed its check again."""
    from drill_helpers import Drill, wait_for

    d = Drill(cluster)
    if d.spare_gate_on():
        wait_for("the spares qualified", d.spares_qualified, timeout=120.0, step=1.0)


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


@pytest.mark.parametrize("where", ["a node drawn at random", "the batch host"])
def test_xid79_retries_the_step_in_the_same_job_on_a_spare(
    cluster: LocalCluster, where: str
) -> None:
    """On the batch host too: Slurm keeps that node in the job, drained, and the step
    runs again on the others and the spare."""
    from drill_helpers import Dice

    job_id, out = drill.submit_training(
        cluster, steps=30, step_time=0.3, ckpt_every=5, auto_resume=None, script=SCRIPT
    )
    nodes = running_with_steps(cluster, job_id, out, 6)
    states = States(cluster, job_id)
    batch_host = drill.job_of(cluster, job_id).batch_host
    assert batch_host in nodes
    victim = batch_host if where == "the batch host" else Dice("step retry").node("victim", nodes)
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
    assert slurm.node(victim).drained  # nothing else lands on it after the job
    kinds = [e["kind"] for e in events(cluster, job_id)]
    assert "step_end" in kinds and "step_retry_planned" in kinds
    assert "requeue" not in kinds
    if victim == batch_host:
        said = [
            str(e["message"]) for e in events(cluster, job_id) if e["kind"] == "step_retry_shrink"
        ]
        assert said and f"{victim} kept as the batch host only" in said[0], said


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
        lambda: tl if len((tl := drill.parse_train_log(out.read_text())).attempts) >= 2 else None,
        interval=0.3,
    )
    assert log is not None  # wait_for returns only what is truthy
    again_at = log.attempts[1].started_at
    other = slurm.job(waiting)
    assert other is not None
    assert other.state == "PENDING" or (
        other.start_time is not None and other.start_time.timestamp() > again_at
    ), (other, again_at)
    done = drill.wait_job_end(cluster, job_id, timeout=180)
    assert done.state == "COMPLETED" and done.restart_count == 0
    slurm.cancel(waiting)


def fresh_events(cluster: LocalCluster, job_id: int) -> list[str]:
    return [str(e["kind"]) for e in events(cluster, job_id)]


def test_without_a_spare_the_job_is_requeued_and_the_event_says_why(
    cluster: LocalCluster,
) -> None:
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    for spare in cluster.spares:
        slurm.drain(spare, "maintenance: no spare today")
    job_id, out = drill.submit_training(
        cluster, steps=20, step_time=0.3, ckpt_every=5, auto_resume=None, script=SCRIPT
    )
    victim = sorted(running_with_steps(cluster, job_id, out, 4))[-1]
    drill.inject_xid(cluster, victim)
    done = drill.wait_job_end(cluster, job_id, timeout=180)
    assert done.state == "COMPLETED" and done.restart_count == 1
    said = [e for e in events(cluster, job_id) if e["kind"] == "step_retry_requeue"]
    assert len(said) == 1 and "spare" in str(said[0]["cause"]), said
    assert fresh_events(cluster, job_id).count("requeue") == 1


def test_two_faults_within_a_second_are_one_recovery_never_two_surgeries(
    cluster: LocalCluster,
) -> None:
    """XID 79 on two nodes of the job (drawn at random, the batch host among them)
    within a second: one surgery at most, never two at once. The agents report a probe
    cycle apart: a second fault seen before the spare joins rolls the surgery back to
    one requeue naming both; one seen after it ends the retried step, which is then
    requeued (no second surgery: the job's in-place retry replaces one node)."""
    from drill_helpers import Dice

    job_id, out = drill.submit_training(
        cluster, steps=30, step_time=0.3, ckpt_every=5, auto_resume=None, script=SCRIPT
    )
    nodes = running_with_steps(cluster, job_id, out, 6)
    first, second = Dice("two faults").nodes("faulty nodes", nodes, 2)
    at = drill.inject_xid(cluster, first)
    assert drill.inject_xid(cluster, second) - at < 1.0
    done = drill.wait_job_end(cluster, job_id, timeout=240)
    text = out.read_text()
    assert done.state == "COMPLETED", text[-2000:]
    mine = events(cluster, job_id)
    kinds = [str(e["kind"]) for e in mine]
    assert kinds.count("step_retry_planned") <= 1, kinds
    assert kinds.count("requeue") <= 1 and done.restart_count == kinds.count("requeue"), kinds
    if "requeue" in kinds:
        why = [e for e in mine if e["kind"] in ("step_retry_requeue", "step_retry_failed")]
        assert why and all(e.get("cause") for e in why), why
    log = drill.parse_train_log(text)
    last = log.attempts[-1]
    assert log.done_step == 30 and last.resumed_from is not None and last.resumed_from >= 5
    # A faulty node runs the job again only once repaired: rebooted and checked again.
    from drill_helpers import Drill

    for name in {first, second} & set(expand_hostlist(last.nodes)):
        repaired = {
            str(e["kind"])
            for e in Drill(cluster).events(name)
            if datetime.fromisoformat(str(e["at"])).timestamp() >= at
        }
        assert {"reboot", "deep_check_ok"} <= repaired, (name, last.nodes, repaired)


def _script(cluster: LocalCluster, body: str) -> str:
    path = cluster.dir / "out" / f"app-{abs(hash(body))}.py"
    path.write_text(body)
    return str(path)


@pytest.mark.parametrize(
    ("code", "why"),
    [(1, "on healthy nodes"), (93, "asked not to restart")],
)
def test_an_application_failure_and_exit_93_are_not_retried(
    cluster: LocalCluster, code: int, why: str
) -> None:
    app = _script(cluster, f"import sys, time\ntime.sleep(1)\nsys.exit({code})\n")
    job_id, out = drill.submit_training(
        cluster, auto_resume=None, script=SCRIPT, env={"TRAIN_SCRIPT": app}
    )
    done = drill.wait_job_end(cluster, job_id, timeout=60)
    assert done.state == "FAILED" and done.restart_count == 0
    text = out.read_text()
    assert text.count("attempt ") == 1 and "FAIL: " in text and why in text, text
    assert "step_retry_fail" in fresh_events(cluster, job_id)
    # and nothing requeues it afterwards: a few reconcile passes (every 2 s) later
    time.sleep(5)
    assert drill.job_of(cluster, job_id).restart_count == 0


def test_a_step_the_user_cancels_is_not_retried(cluster: LocalCluster) -> None:
    job_id, out = drill.submit_training(
        cluster, steps=60, step_time=0.3, auto_resume=None, script=SCRIPT
    )
    running_with_steps(cluster, job_id, out, 2)
    subprocess.run(
        ["scancel", f"{job_id}.0"], env=cluster.env, timeout=30, check=True, capture_output=True
    )
    done = drill.wait_job_end(cluster, job_id, timeout=60)
    assert done.state == "FAILED" and done.restart_count == 0
    text = out.read_text()
    assert "was cancelled" in text and text.count("attempt ") == 1, text


@pytest.mark.parametrize("point", ["drain", "shrink", "absorb"])
def test_controller_killed_mid_surgery_finishes_it_once(cluster: LocalCluster, point: str) -> None:
    from hyperpod_agent.controller.crash import CRASH_AT_ENV
    from hyperpod_agent.localcluster import procs

    services = cluster.services
    services.stop("controller")
    pid = services.start_controller(env={CRASH_AT_ENV: f"step_retry:{point}"})
    job_id, out = drill.submit_training(
        cluster, steps=24, step_time=0.3, ckpt_every=5, auto_resume=None, script=SCRIPT
    )
    nodes = running_with_steps(cluster, job_id, out, 4)
    victim = sorted(nodes)[-1]
    drill.inject_xid(cluster, victim)
    drill.wait_for(f"the controller to die after {point}", 60, lambda: not procs.alive(pid))
    services.start_controller()
    done = drill.wait_job_end(cluster, job_id, timeout=180)
    text = out.read_text()
    assert done.state == "COMPLETED" and done.restart_count == 0, text[-1500:]
    spare = cluster.spares[0]
    kept = [n for n in nodes if n != victim]
    log = drill.parse_train_log(text)
    assert [a.nodes for a in log.attempts] == [
        compress_hostlist(nodes),
        compress_hostlist([*kept, spare]),
    ]
    kinds = fresh_events(cluster, job_id)
    assert kinds.count("step_retry_done") == 1 and "requeue" not in kinds, kinds
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    helpers = [j for j in slurm.list_jobs() if j.name == f"hyperpod-expand-{job_id}"]
    assert all(j.state in drill.ENDED for j in helpers), helpers
    drill.wait_for(
        "the spare's reservation gone",
        30,
        lambda: all(not r.name.startswith("hyperpod-expand-") for r in slurm.reservations()),
    )
