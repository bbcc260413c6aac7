"""A human's drain or resume, made in the middle of one of the controller's own
actions, on the real local cluster: the human's state is never undone.

Each drill starts the controller with a pause point (``HYPERPOD_TEST_PAUSE_AT``,
controller/crash.py): it stops itself (SIGSTOP) once, at a named point of its action,
and the drill acts as the admin while it is stopped: ``scontrol update`` as root,
with the admin's own reason (never ``hyperpod:...``). Then it continues the controller
(SIGCONT) and checks Slurm (``sinfo``, slurmctld's log), the controller's event log
(the admin CLI) and its gate's log: the human's state stands, the controller says it
refused or skipped, and nothing else changed.

The nodes faults land on are drawn at random, the seed printed
(``HYPERPOD_DRILL_SEED=<seed>`` replays a drill's choices); where a job is involved
its batch host is one of the candidates. One cluster for the module, a controller on
empty state for every drill.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drill_helpers import (
    REBOOT_FLAGS,
    Dice,
    Drill,
    frozen,
    kept_passing,
    new_events,
    passes,
    wait_for,
)

from hyperpod_agent.controller.crash import PAUSE_AT_ENV
from hyperpod_agent.localcluster import deepchecks, drill
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.hostlist import compress_hostlist

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

HUMAN_DIR = Path("/var/tmp/hyperpod-human-drain")
HUMAN_PORT_BASE = 19217
ADMIN_REASON = "RMA 4711 bad riser, keep out (alice)"
NO_GATES = {"gate_reentry": False, "gate_spares": False}
FREEZE_S = 120.0  # a fault to the pause point: a reboot and a deep check at the most
OBSERVE_S = 8.0  # a few reconcile passes (2 s) after the controller continued
SCRIPT = "train_in_place.sbatch"  # srun --auto-resume=1: the step is retried in the job


@pytest.fixture(scope="module")
def human_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster(HUMAN_DIR, nodes=4, spares=1, port_base=HUMAN_PORT_BASE)
    try:
        cluster.up(timeout=60, services=True)
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def d(human_cluster: LocalCluster) -> Iterator[Drill]:
    """The cluster restored; afterwards the controller continued, restarted on empty
    state without a pause point, and the cluster restored again."""
    d = Drill(human_cluster)
    yield d
    pid = d.services.pid("controller")
    if pid is not None:
        os.kill(pid, signal.SIGCONT)  # never leave a stopped controller behind
    deepchecks.write_scenario(d.cluster.dir, {})
    d.fresh_controller(deep_checks=NO_GATES)
    d.restore(timeout=120)


def armed(d: Drill, point: str, **settings: Any) -> int:
    """A controller on empty state that stops itself at ``point``; its pid."""
    d.fresh_controller(env={PAUSE_AT_ENV: point}, **settings)
    d.restore()
    pid = d.services.pid("controller")
    assert pid is not None
    return pid


def stopped_at(d: Drill, pid: int, point: str, timeout: float = FREEZE_S) -> None:
    """Waits until the controller stopped itself, and checks it did so at ``point``."""
    wait_for(f"the controller to stop at {point}", lambda: frozen(pid), timeout, 0.2,
             detail=d.describe)  # fmt: skip
    text = (d.cluster.dir / "log" / "controller.log").read_text(errors="replace")
    where = re.findall(rf"{PAUSE_AT_ENV}=(\S+): stopping until continued", text)
    assert where and (where[-1] == point or where[-1].startswith(point + ":")), where


class Log:
    """A log file from now on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = path.stat().st_size

    def text(self) -> str:
        return self.path.read_bytes()[self.start :].decode(errors="replace")

    def lines(self) -> list[str]:
        return self.text().splitlines()


def ctld(d: Drill) -> Log:
    return Log(d.cluster.dir / "log" / "slurmctld.log")


def controller_log(d: Drill) -> Log:
    return Log(d.cluster.dir / "log" / "controller.log")


def changes_to(log: Log, node: str) -> list[str]:
    """slurmctld's lines for a change of ``node``'s state or reason, or a reboot."""
    mark = re.compile(rf"update_node: node {node} |reboot request queued for nodes {node}\b")
    return [ln for ln in log.lines() if mark.search(ln)]


def sinfo(d: Drill, node: str) -> tuple[str, str]:
    """(state, reason) as ``sinfo`` shows them."""
    res = subprocess.run(
        ["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"],
        env=d.env, capture_output=True, text=True, timeout=20, check=True,
    )  # fmt: skip
    state, _, reason = res.stdout.strip().splitlines()[0].partition("|")
    return state, reason


def held_by_human(d: Drill, node: str) -> None:
    """``node`` is drained with the admin's reason, as ``sinfo`` shows it."""
    state, reason = sinfo(d, node)
    assert state.startswith("drain") and reason == ADMIN_REASON, (state, reason, d.describe())


def left_alone(changes: list[str]) -> None:
    """Since the admin drained the node, Slurm shows only the admin's change."""
    undone = [
        ln for ln in changes if not (f"reason set to: {ADMIN_REASON}" in ln or "to DRAIN" in ln)
    ]
    assert undone == [], undone


def gate_lines(log: Log, node: str) -> list[str]:
    return [ln for ln in log.lines() if re.search(rf"gate: \w+ {node}\b", ln)]


def helpers_of(d: Drill, job_id: int) -> list[Any]:
    return [j for j in d.slurm.list_jobs() if j.name == f"hyperpod-expand-{job_id}"]


def running_with_steps(d: Drill, job_id: int, out: Path, steps: int) -> list[str]:
    drill.wait_for(
        f"job {job_id} to reach step {steps}",
        90,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= steps,
    )
    return list(drill.job_of(d.cluster, job_id).nodes)


# --- 1. a human drain while a failed deep check escalates to a replacement -------------


@pytest.mark.parametrize(
    "point",
    [
        "deep_check:escalate",  # the check's failure recorded, the replacement not planned
        "intent:replace",  # the replacement planned and committed, not yet applied
    ],
)
def test_a_human_drain_during_a_deep_check_escalation_is_kept(d: Drill, point: str) -> None:
    """A node back from its reboot fails its re-entry check: held, about to be
    replaced. The admin drains it then; the replacement never happens and the spare
    stays in the pool."""
    dice = Dice(f"human drain at {point}")
    victim = dice.node("node failing its re-entry check", d.nodes)
    spare = d.spares[0]
    deepchecks.write_scenario(d.cluster.dir, {victim: {"all_reduce_perf": {"busbw_gbps": 40}}})
    pid = armed(d, point, deep_checks={"gate_reentry": True, "gate_spares": False})
    since = d.last_event_id()
    d.inject_xid(victim, 79, gpu=3, message="GPU has fallen off the bus")
    stopped_at(d, pid, point)
    node = d.node(victim)
    assert node.drained and "deep-check nccl-allreduce" in node.reason, d.describe()
    slurm_log, gate_log = ctld(d), controller_log(d)
    d.human_drain(victim, ADMIN_REASON)
    os.kill(pid, signal.SIGCONT)
    before, woke = passes(d.services.controller_url), time.monotonic()

    def refused() -> list[dict[str, Any]]:
        kinds = ("deep_check_left", "abandoned")
        return [e for e in new_events(d, since, victim) if e["kind"] in kinds]

    wait_for("the controller to say it left the node", lambda: bool(refused()), 30, 0.5)
    time.sleep(OBSERVE_S)
    kept_passing(d.services.controller_url, before, woke)
    said = refused()
    assert len(said) == 1 and ADMIN_REASON in said[0]["message"], said
    assert said[0]["kind"] == ("deep_check_left" if point == "deep_check:escalate" else "abandoned")
    events = new_events(d, since, victim)
    assert [e for e in events if e["kind"] in ("replace", "replace_started")] == [], events
    held_by_human(d, victim)
    left_alone(changes_to(slurm_log, victim))
    assert changes_to(slurm_log, spare) == [], slurm_log.text()
    assert [ln for ln in gate_lines(gate_log, victim) if "refused" not in ln] == []
    spare_node = d.node(spare)
    assert spare_node.drained and spare_node.reason == "hyperpod:spare", d.describe()
    assert [r.name for r in d.slurm.reservations()] == []
    print(f"  told: {said[0]['message']}")


# --- 2. a human drain before a command provider's replacement completes ------------------


def test_a_human_drain_before_a_command_replacement_completes_is_kept(d: Drill) -> None:
    """The admin's replace command rebuilds the node (here: a fresh boot of it); it
    came back and the controller is about to resume it when the admin drains it. The
    completion resumes nothing: the gate refuses, the action is done, not resumed."""
    dice = Dice("human drain before a command replacement completes")
    victim = dice.node("node replaced by the command", d.nodes)
    command = [sys.executable, "-m", "hyperpod_agent", "local-cluster", "node-reboot",
               "--dir", str(d.cluster.dir)]  # fmt: skip
    pid = armed(
        d,
        "came_back:replace",
        deep_checks=NO_GATES,
        policy={"fault_overrides": {"xid79": {"action": "REPLACE", "urgent": True}}},
        provider={"kind": "command", "command": command, "command_timeout_s": 60.0},
    )
    since = d.last_event_id()
    slurmd = d.cluster.slurmd_pid(victim)
    d.inject_xid(victim, 79, gpu=3, message="GPU has fallen off the bus")
    stopped_at(d, pid, "came_back:replace")
    node = d.node(victim)
    assert node.drained and node.reason.startswith("hyperpod:replace gpu3 xid79"), d.describe()
    assert d.cluster.slurmd_pid(victim) not in (None, slurmd)  # the command rebuilt it
    slurm_log, gate_log = ctld(d), controller_log(d)
    d.human_drain(victim, ADMIN_REASON)
    os.kill(pid, signal.SIGCONT)
    before, woke = passes(d.services.controller_url), time.monotonic()

    def done() -> list[dict[str, Any]]:
        return [e for e in new_events(d, since, victim) if e["kind"] == "replace"]

    wait_for("the replacement recorded done", lambda: bool(done()), 30, 0.5)
    time.sleep(OBSERVE_S)
    kept_passing(d.services.controller_url, before, woke)
    told = done()
    assert len(told) == 1 and "not resumed" in told[0]["message"], told
    assert ADMIN_REASON in told[0]["message"], told
    refusals = [ln for ln in gate_log.lines() if f"gate: resume {victim} refused" in ln]
    assert len(refusals) == 1, gate_log.text()[-3000:]
    assert [ln for ln in gate_lines(gate_log, victim) if "refused" not in ln] == []
    held_by_human(d, victim)
    left_alone(changes_to(slurm_log, victim))
    started = [e for e in new_events(d, since, victim) if e["kind"] == "replace_started"]
    assert len(started) == 1, started  # the command ran once


# --- 3. step retry: a human resume during its drain, a human drain during its rollback ---


def step_retry_job(
    d: Drill, dice: Dice, batch_host: bool = True
) -> tuple[int, Path, list[str], str, str]:
    """A job whose step is retried in place; (id, output, nodes, batch host, the node
    the fault lands on, drawn from its nodes, the batch host included if asked)."""
    job_id, out = drill.submit_training(
        d.cluster, steps=30, step_time=0.3, ckpt_every=5, auto_resume=None, script=SCRIPT
    )
    nodes = running_with_steps(d, job_id, out, 4)
    batch = drill.job_of(d.cluster, job_id).batch_host
    print(f"  job {job_id} on {','.join(nodes)} (batch host {batch})")
    eligible = [n for n in nodes if batch_host or n != batch]
    return job_id, out, nodes, batch, dice.node("node the fault lands on", eligible)


def repaired(d: Drill, node: str) -> None:
    """The admin's repair: healthy GPUs and the node's agent restarted, its first
    report (healthy) made and on its way to the controller."""
    cache = d.services.cache(node)
    before = json.loads(cache.read_text())["agent_id"]
    d.heal_gpus(node)
    d.restart_agent(node)

    def reported() -> bool:
        report = json.loads(cache.read_text())
        return bool(report["agent_id"] != before and report["verdict"] == "healthy")

    wait_for(f"{node}'s agent to report healthy after its restart", reported, 30, 0.2)


def test_a_human_resume_during_a_step_retry_drain_is_not_drained_again(d: Drill) -> None:
    """The surgery drained the faulty node, its phase not yet written. The admin
    repairs the node (healthy GPUs, its agent restarted) and resumes it. The surgery
    goes on (shrink, the spare merged, the step run again) and never drains it again,
    nor does anything else. A fault on the batch host is no surgery at all (a requeue:
    test_a_fault_on_the_batch_host_is_not_a_surgery_slurm_refuses), so the fault lands
    on one of the other nodes."""
    dice = Dice("human resume during a step-retry drain")
    pid = armed(d, "step_retry:drain", deep_checks=NO_GATES)
    spare = d.spares[0]
    job_id, out, nodes, batch, victim = step_retry_job(d, dice, batch_host=False)
    since = d.last_event_id()
    d.inject_xid(victim, 79, gpu=3, message="GPU has fallen off the bus")
    stopped_at(d, pid, "step_retry:drain", 60)
    node = d.node(victim)
    assert node.drained and node.reason.startswith("hyperpod:replace gpu3 xid79"), d.describe()
    repaired(d, victim)
    slurm_log, gate_log = ctld(d), controller_log(d)
    d.human_resume(victim)
    os.kill(pid, signal.SIGCONT)
    done = drill.wait_job_end(d.cluster, job_id, timeout=180)
    text = out.read_text()
    time.sleep(OBSERVE_S)
    kinds = [e["kind"] for e in new_events(d, since) if e.get("job_id") == job_id]
    assert victim != batch
    assert done.state == "COMPLETED" and done.restart_count == 0, text[-1500:]
    kept = [n for n in nodes if n != victim]
    log = drill.parse_train_log(text)
    assert [a.nodes for a in log.attempts] == [
        compress_hostlist(nodes),
        compress_hostlist([*kept, spare]),
    ], text[-1500:]
    assert kinds.count("step_retry_done") == 1 and "requeue" not in kinds, kinds
    state, reason = sinfo(d, victim)
    assert state == "idle" and reason == "none", (state, reason, d.describe())
    changed = changes_to(slurm_log, victim)  # the admin's resume, nothing after it
    resumed = ("state set to IDLE", "state set to ALLOCATED", "state set to MIXED")
    assert [ln for ln in changed if not any(r in ln for r in resumed)] == [], changed
    assert [ln for ln in gate_lines(gate_log, victim) if "skipped" not in ln] == []


def test_a_human_drain_of_the_spare_during_a_step_retry_rollback_is_kept(d: Drill) -> None:
    """The spare left the pool for a surgery (reserved, resumed, its helper allocation
    granted); the helper is lost (cancelled), so the surgery rolls back. While the
    rollback is about to drain the spare back to the pool, the admin drains it. It
    stays drained with the admin's reason, its reservation goes only once it is
    drained, and the job is requeued and completes."""
    dice = Dice("human drain of the spare during a step-retry rollback")
    pid = armed(d, "step_retry:expand,step_retry:rollback", deep_checks=NO_GATES)
    spare = d.spares[0]
    # Not the batch host: a fault there rolls back before the spare leaves the pool.
    job_id, out, nodes, _, victim = step_retry_job(d, dice, batch_host=False)
    since = d.last_event_id()
    d.inject_xid(victim, 79, gpu=3, message="GPU has fallen off the bus")
    stopped_at(d, pid, "step_retry:expand", 60)
    helpers = [j for j in helpers_of(d, job_id) if j.state == "RUNNING"]
    assert [h.nodes for h in helpers] == [(spare,)], helpers
    subprocess.run(
        ["scancel", str(helpers[0].job_id)], env=d.env, timeout=20, check=True,
        capture_output=True,
    )  # fmt: skip
    os.kill(pid, signal.SIGCONT)
    stopped_at(d, pid, "step_retry:rollback", 60)
    reservation = f"hyperpod-expand-{job_id}"
    spare_node = d.node(spare)
    assert not spare_node.drained, d.describe()
    assert reservation in [r.name for r in d.slurm.reservations()]
    slurm_log, gate_log = ctld(d), controller_log(d)
    d.human_drain(spare, ADMIN_REASON)
    os.kill(pid, signal.SIGCONT)
    done = drill.wait_job_end(d.cluster, job_id, timeout=180)
    text = out.read_text()
    assert done.state == "COMPLETED" and done.restart_count == 1, text[-1500:]
    time.sleep(OBSERVE_S / 2)
    held_by_human(d, spare)
    changed = changes_to(slurm_log, spare)
    left_alone(changed)
    lines = slurm_log.lines()
    drained_at = next(i for i, ln in enumerate(lines) if f"node {spare} reason set to" in ln)
    gone = f"delete_reservation complete for {reservation}"
    deleted = [i for i, ln in enumerate(lines) if gone in ln]
    assert len(deleted) == 1 and deleted[0] > drained_at, slurm_log.text()
    refusals = [ln for ln in gate_log.lines() if f"gate: drain {spare} refused" in ln]
    assert len(refusals) == 1, gate_log.text()[-3000:]
    assert [ln for ln in gate_lines(gate_log, spare) if "refused" not in ln] == []
    kinds = [e["kind"] for e in new_events(d, since) if e.get("job_id") == job_id]
    assert "step_retry_failed" in kinds and kinds.count("step_retry_requeue") == 1, kinds
    assert "step_retry_done" not in kinds, kinds
    assert not d.node(victim).flags & REBOOT_FLAGS
    assert all(h.state in drill.ENDED for h in helpers_of(d, job_id))


# --- found by the drills above: a fault on the batch host -------------------------------


def test_a_fault_on_the_batch_host_is_not_a_surgery_slurm_refuses(d: Drill) -> None:
    """Slurm never takes a job's batch host out of the job: ``scontrol update jobid=J
    NodeList=<the others>`` answers "Invalid node name specified". A fault on the batch
    host must therefore be answered REQUEUE at once, not with a surgery that drains
    the node, fails its shrink and rolls back. Fails today: the step-retry decision
    (controller/api/steps.py, autoresume.py) does not look at the batch host."""
    d.restore()
    job_id, out = drill.submit_training(
        d.cluster, steps=30, step_time=0.3, ckpt_every=5, auto_resume=None, script=SCRIPT
    )
    running_with_steps(d, job_id, out, 4)
    batch = drill.job_of(d.cluster, job_id).batch_host
    since = d.last_event_id()
    d.inject_xid(batch, 79, gpu=3, message="GPU has fallen off the bus")
    done = drill.wait_job_end(d.cluster, job_id, timeout=180)
    assert done.state == "COMPLETED", out.read_text()[-1500:]
    story = [e for e in new_events(d, since) if e.get("job_id") == job_id]
    failed = [e["message"] for e in story if e["kind"] == "step_retry_failed"]
    assert failed == [], failed
