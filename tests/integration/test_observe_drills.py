"""Observe mode on the local cluster: the controller decides every automatic action,
tells it (event ``would_have``, ``hyperpod_would_have_total``) and changes nothing in
Slurm (docs/operations.md, "Observe, then act").

Each drill injects real faults, each on a node drawn by seeded dice (replay with
HYPERPOD_DRILL_SEED): XIDs that ask a reboot and a replacement, a full and a read-only
scratch disk, a node gone silent (its agent and slurmd killed), an urgent fault under a
running auto-resume job, a failed ``srun --auto-resume`` step on a faulty node, a frozen
rank. From before the first fault until the drill's last check, a watcher reads Slurm
several times a second and keeps every change the controller could have made: a node's
drain or reboot flags or its reason, a reservation, a job requeued or cancelled. What
Slurm does by itself is not the controller's and is not compared: a node whose slurmd
was killed goes DOWN "Not responding", nodes running jobs are allocated, a job whose
rank died fails.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from drill_helpers import (
    DETECT_S,
    REBOOT_FLAGS,
    SPARE_REASON,
    Dice,
    Drill,
    new_events,
    passes,
    samples,
    wait_for,
)

from hyperpod_agent.localcluster import drill as training
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.models import Node

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

OBSERVE = {
    "mode": "observe",
    # A drill here puts a fault on every in-service node at once: the blast-radius
    # limit would hold the decisions back (incident mode has its own drills).
    "max_unhealthy_fraction": 1.0,
    # A silent node is told within seconds rather than the local cluster's 30.
    "heartbeat_timeout_s": 10.0,
}
# Observe mode runs no deep check, so a spare the gate wants qualified never is: no
# swap and no step retry could be told. Ungated, the spare is ready as in act mode.
SPARES_UNGATED = {"gate_spares": False}
SILENT_S = 40.0  # node killed -> told: heartbeat timeout, SlurmdTimeout (6 s), passes
JOB_S = 90.0  # a 2-node training job submitted -> running its steps
HANG_S = 60.0  # ranks frozen -> hang declared (test_hang_drills.py)
WATCH_EVERY_S = 0.25
MESSAGE = re.compile(r"^observe: would (\w+) (.+?): (.*)$", re.S)
NOT_RESPONDING = "Not responding"  # the reason slurmctld gives a node it lost


def ours(node: Node) -> tuple[bool, frozenset[str], str]:
    """What of a node only the controller would change: drained, rebooting, its reason."""
    return "DRAIN" in node.flags, node.flags & REBOOT_FLAGS, node.reason.strip()


class Unchanged:
    """Reads Slurm every WATCH_EVERY_S from its start to ``stop`` and keeps each change
    the controller could have made. ``silent`` names the nodes whose slurmd the drill
    killed (slurmctld's own DOWN and reason for them are allowed); ``jobs`` the drill's
    jobs, which must never be requeued nor cancelled."""

    def __init__(self, drill: Drill) -> None:
        self.drill = drill
        self.before = {n.name: ours(n) for n in drill.slurm.list_nodes()}
        self.reservations = self._reservations()
        self.silent: set[str] = set()
        self.jobs: set[int] = set()
        self.changes: list[str] = []
        self.looks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _reservations(self) -> list[str]:
        return sorted(repr(r) for r in self.drill.slurm.reservations())

    def _note(self, change: str) -> None:
        if change not in self.changes:
            self.changes.append(change)

    def look(self) -> None:
        for node in self.drill.slurm.list_nodes():
            drained, rebooting, reason = ours(node)
            was = self.before.get(node.name)
            if was is None:
                self._note(f"{node.name}: a node that was not there")
                continue
            if node.name in self.silent and reason in (was[2], NOT_RESPONDING):
                reason = was[2]  # slurmctld's, not ours
            if (drained, rebooting, reason) != was:
                self._note(f"{node.name}: {was} -> {(drained, sorted(rebooting), reason)}")
        if (now := self._reservations()) != self.reservations:
            self._note(f"reservations {self.reservations} -> {now}")
        for job in self.drill.slurm.list_jobs():
            if job.job_id not in self.jobs:
                continue
            if job.restart_count:
                self._note(f"job {job.job_id} requeued (restart count {job.restart_count})")
            if job.state.upper() in ("CANCELLED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
                self._note(f"job {job.job_id} {job.state}")
        self.looks += 1

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            try:
                self.look()
            except Exception:  # noqa: BLE001 - a slow scontrol: the next look counts
                continue

    def stop(self) -> list[str]:
        """Stops watching after one last look; every change seen."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(30)
            self.look()
        assert self.looks >= 4, f"Slurm was read only {self.looks} times"
        return self.changes


def would_haves(drill: Drill, since: int) -> list[dict[str, Any]]:
    """What an operator reads: ``hyperpod events --kind would_have``, oldest first."""
    events = drill.hyperpod_json("events", "--kind", "would_have", "--limit", "1000")
    return sorted((e for e in events if int(e["id"]) > since), key=lambda e: int(e["id"]))


def action_of(event: dict[str, Any]) -> str:
    found = MESSAGE.match(str(event["message"]))
    assert found, event
    return found.group(1)


def told(
    drill: Drill,
    since: int,
    action: str,
    *,
    node: str | None = None,
    job: int | None = None,
    cause: str = "",
) -> list[dict[str, Any]]:
    """The would_have events since ``since`` of ``action`` about ``node`` / ``job``,
    whose cause says ``cause``."""
    return [
        e
        for e in would_haves(drill, since)
        if action_of(e) == action
        and (node is None or e["node"] == node)
        and (job is None or e["job_id"] == job)
        and cause in str(e["cause"])
    ]


def wait_told(drill: Drill, since: int, action: str, timeout: float, **what: Any) -> None:
    wait_for(
        f"would {action} {what}",
        lambda: bool(told(drill, since, action, **what)),
        timeout,
        0.5,
        detail=lambda: [e["message"] for e in would_haves(drill, since)],
    )


def would_counts(drill: Drill) -> Counter[str]:
    """``hyperpod_would_have_total`` by action."""
    found = samples(drill.services.controller_url, "hyperpod_would_have_total")
    return Counter({re.sub(r'^action="(\w+)"$', r"\1", k): int(v) for k, v in found.items()})


def gate_calls_made(drill: Drill) -> dict[str, float]:
    """Calls the gate let through to Slurm (outcome done or failed), by labels."""
    found = samples(drill.services.controller_url, "hyperpod_gate_calls_total")
    return {k: v for k, v in found.items() if re.search(r'outcome="(done|failed)"', k)}


def more_passes(drill: Drill, n: int = 3) -> None:
    """Waits for ``n`` more good reconcile passes: a decision made once has had the
    chance to be made again, or to be acted on."""
    url = drill.services.controller_url
    start = passes(url).get("ok", 0)
    wait_for(f"{n} more passes", lambda: passes(url).get("ok", 0) >= start + n, 30, 0.5)


class Told:
    """The drill's would_have events and metric counts, from its start."""

    def __init__(self, drill: Drill) -> None:
        self.drill = drill
        self.since = drill.last_event_id()
        self.counts = would_counts(drill)
        self.gate = gate_calls_made(drill)

    def check(self) -> list[dict[str, Any]]:
        """The events; each counted in hyperpod_would_have_total under its action, and
        nothing let through the gate meanwhile."""
        got: dict[str, Any] = {}

        def agree() -> bool:
            counts = would_counts(self.drill)
            events = would_haves(self.drill, self.since)
            again = would_counts(self.drill)
            got.update(events=events, counts=counts - self.counts)
            return counts == again  # no would_have told between the two reads

        wait_for("a quiet moment to compare events and metrics", agree, 20, 0.5)
        events = got["events"]
        for e in events:
            print(f"  {e['at']} {e['message']}")
        ids = [int(e["id"]) for e in events]
        whole = [
            int(e["id"])
            for e in new_events(self.drill, self.since)
            if e["kind"] == "would_have" and int(e["id"]) <= max(ids, default=0)
        ]
        assert sorted(whole) == ids, "--kind would_have left some out"
        assert Counter(action_of(e) for e in events) == got["counts"], (events, got["counts"])
        assert gate_calls_made(self.drill) == self.gate, "the gate let calls through to Slurm"
        return list(events)


def once_each(events: list[dict[str, Any]]) -> None:
    """A decision that stands pass after pass is told once (a new cause is a new
    decision: told again)."""
    seen = Counter(str(e["message"]) for e in events)
    assert all(n == 1 for n in seen.values()), seen


def once_per_target(events: list[dict[str, Any]]) -> None:
    """One event per action and target: for decisions whose cause stays what it was."""
    seen = Counter(found.group(1, 2) for e in events if (found := MESSAGE.match(str(e["message"]))))
    again = {k: n for k, n in seen.items() if n > 1}
    assert not again, (again, [e["message"] for e in events])


@pytest.fixture(scope="module")
def drill(service_cluster: LocalCluster) -> Iterator[Drill]:
    d = Drill(service_cluster)
    d.fresh_controller(policy=OBSERVE, deep_checks=SPARES_UNGATED)
    d.restore()
    assert d.status()["mode"] == "observe"
    yield d
    d.restore()
    # The local cluster's own policy (act) for the modules after, which start from a
    # fresh controller of their own.
    d.fresh_controller()


def submit(drill: Drill, watch: Unchanged, **kwargs: Any) -> tuple[int, Any]:
    job_id, out = training.submit_training(drill.cluster, **kwargs)
    watch.jobs.add(job_id)
    return job_id, out


def steps_done(drill: Drill, job_id: int, out: Any, steps: int) -> tuple[str, ...]:
    """The job's nodes once it has taken ``steps`` steps."""
    wait_for(
        f"job {job_id} at step {steps}",
        lambda: out.exists() and training.parse_train_log(out.read_text()).last_step >= steps,
        JOB_S,
        0.5,
        detail=lambda: drill.slurm.job(job_id),
    )
    return training.job_of(drill.cluster, job_id).nodes


def on_job(dice: Dice, drill: Drill, role: str, job_id: int) -> str:
    """One node of the running job (its batch host as likely as the others)."""
    job = training.job_of(drill.cluster, job_id)
    return dice.node(f"{role} of job {job_id} (batch host {job.batch_host})", job.nodes)


# --- node faults: reboot, replace, drain -----------------------------------------------


def test_node_faults_are_told_and_nothing_is_done(drill: Drill) -> None:
    dice = Dice("observe: node faults")
    xid79, xid54, full, readonly = dice.nodes(
        "xid79, xid54, full scratch, read-only scratch", drill.nodes, 4
    )
    said = Told(drill)
    watch = Unchanged(drill)
    try:
        drill.inject_xid(xid79, 79, gpu=3, message="GPU has fallen off the bus")
        drill.inject_xid(xid54, 54, gpu=1, message="auxiliary power is not connected")
        drill.fill_scratch(full)
        drill.remount_scratch(readonly, read_only=True)
        for action, node, cause in (
            ("reboot", xid79, "xid79"),
            ("replace", xid54, "xid54"),
            ("drain", full, "fs_full"),
            ("reboot", readonly, "fs_readonly"),
        ):
            wait_told(drill, said.since, action, DETECT_S, node=node, cause=cause)
        more_passes(drill)
        changes = watch.stop()
        assert not changes, changes
        events = said.check()
        once_each(events)
        [reboot] = told(drill, said.since, "reboot", node=xid79, cause="xid79")
        assert reboot["message"].startswith(f"observe: would reboot {xid79}: gpu3 xid79: ")
        # the nodes stayed in service: nobody rebooted them (a reboot restarts slurmd)
        assert all(drill.cluster.slurmd_pid(n) is not None for n in drill.nodes)
    finally:
        watch.stop()
        drill.restore(restart_agents=[xid79, xid54])


# --- a silent node, an urgent fault under an auto-resume job ---------------------------


def test_silent_node_and_fault_under_auto_resume_job_are_told(drill: Drill) -> None:
    dice = Dice("observe: silent node, auto-resume job")
    silent = dice.node("silent node (agent and slurmd killed)", drill.nodes)
    said = Told(drill)
    watch = Unchanged(drill)
    job_id = 0
    try:
        watch.silent.add(silent)
        drill.lose_node(silent)
        job_id, out = submit(
            drill, watch, steps=400, step_time=0.3, ckpt_every=5, extra=("-x", silent)
        )
        steps_done(drill, job_id, out, 3)
        victim = on_job(dice, drill, "xid151 node", job_id)
        drill.inject_xid(victim, 151, gpu=2, message="XID 151")
        wait_told(drill, said.since, "requeue", DETECT_S, job=job_id, cause=victim)
        wait_told(
            drill, said.since, "replace", DETECT_S, node=victim, cause=f"auto-resume job {job_id}"
        )
        wait_told(drill, said.since, "drain", SILENT_S, node=silent, cause="heartbeat")
        more_passes(drill)
        # Slurm's own view of the silent node: DOWN, not responding, its reason.
        lost = drill.node(silent)
        assert not lost.responding, lost
        changes = watch.stop()
        assert not changes, changes
        job = training.job_of(drill.cluster, job_id)
        assert job.state == "RUNNING" and job.restart_count == 0, job
        once_each(said.check())
        kinds = {e["kind"] for e in new_events(drill, said.since)}
        assert not kinds & {"requeue", "drain", "reboot", "replace"}, kinds
    finally:
        watch.stop()
        drill.restore(restart_agents=[n for n in drill.nodes if n != silent])


# --- a failed srun --auto-resume step, a frozen rank -----------------------------------


def test_failed_step_is_told_and_answered_fail_and_the_job_goes_on(drill: Drill) -> None:
    dice = Dice("observe: step retry")
    said = Told(drill)
    watch = Unchanged(drill)
    try:
        sync = drill.cluster.dir / "out" / f"sync-{time.time_ns()}"
        sync.mkdir(parents=True)
        job_id, out = submit(
            drill,
            watch,
            steps=400,
            step_time=0.3,
            ckpt_every=5,
            auto_resume=None,
            extra=("--exclusive",),
            script="train_in_place.sbatch",
            # a rank waits this long for a dead peer, then fails (NCCL's timeout)
            train_args=("--sync", str(sync), "--sync-timeout", "5"),
        )
        steps_done(drill, job_id, out, 3)
        bad = on_job(dice, drill, "xid79 node", job_id)
        drill.inject_xid(bad, 79, gpu=4, message="GPU has fallen off the bus")
        # The step's watch (renewed every second) would end the step: told, and the
        # step runs on, as it would without the controller.
        wait_told(drill, said.since, "step_end", DETECT_S, node=bad, job=job_id)
        going = training.parse_train_log(out.read_text()).last_step
        steps_done(drill, job_id, out, going + 3)
        assert "the controller ends the step" not in out.read_text()
        # The fault kills the rank on its node, as XID 79 does to a CUDA process.
        batch_host = training.job_of(drill.cluster, job_id).batch_host
        for record in training.rank_records(drill.cluster, job_id).get(bad, []):
            os.kill(record.pid, signal.SIGKILL)
        done = training.wait_job_end(drill.cluster, job_id, timeout=JOB_S)
        assert done.state == "FAILED" and done.restart_count == 0, done
        text = out.read_text()
        # On the batch host too: it would stay in the job as that only (act mode's rule).
        wait_told(drill, said.since, "step_retry", JOB_S, node=bad, job=job_id)
        assert 'FAIL: mode = "observe": would RETRYSTEP' in text, text[-2000:]
        if bad == batch_host:
            assert f"{bad} stays as the batch host only" in text, text[-2000:]
        assert len(training.parse_train_log(text).attempts) == 1, text[-2000:]
        # ... and the job's requeue is the pass's to tell, the job having failed.
        wait_told(drill, said.since, "requeue", DETECT_S, job=job_id, cause="job failed")
        more_passes(drill)
        changes = watch.stop()
        assert not changes, changes
        once_each(said.check())
        spare = drill.spares[0]
        [retry] = told(drill, said.since, "step_retry", job=job_id)
        assert f"on {spare} for {bad}" in retry["message"], retry
        assert drill.node(spare).reason.strip() == SPARE_REASON
    finally:
        watch.stop()
        drill.restore(restart_agents=drill.nodes)


def test_hang_is_told_and_the_job_left_running(drill: Drill) -> None:
    dice = Dice("observe: hang")
    said = Told(drill)
    watch = Unchanged(drill)
    frozen: list[int] = []
    try:
        sync = drill.cluster.dir / "out" / f"sync-{time.time_ns()}"
        sync.mkdir(parents=True)
        job_id, out = submit(
            drill,
            watch,
            steps=400,
            step_time=0.3,
            ckpt_every=5,
            extra=("--exclusive",),
            train_args=("--sync", str(sync)),
        )
        steps_done(drill, job_id, out, 15)
        suspect = on_job(dice, drill, "frozen rank", job_id)
        frozen = training.freeze_ranks(drill.cluster, job_id, suspect)
        wait_told(drill, said.since, "requeue", HANG_S, job=job_id, cause="hang")
        wait_told(drill, said.since, "reboot", DETECT_S, node=suspect, cause="hang")
        more_passes(drill)
        changes = watch.stop()
        assert not changes, changes
        hung = training.job_of(drill.cluster, job_id)
        assert hung.state == "RUNNING" and hung.restart_count == 0, hung
        [hang] = [e for e in new_events(drill, said.since) if e["kind"] == "hang"]
        assert f"suspect {suspect}" in hang["message"], hang
        # The hang stands, the same hang with the same suspect, pass after pass.
        once_per_target(said.check())
    finally:
        watch.stop()
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        drill.restore(restart_agents=drill.nodes)
