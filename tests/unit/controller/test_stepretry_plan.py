"""The step-retry decision: RETRYSTEP, REQUEUE or FAIL, one row per rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pytest
from ctl_helpers import NOW, action_row, cluster, config, fault, faulty, healthy, node

from hyperpod_agent.controller.snapshot import Snapshot
from hyperpod_agent.controller.stepretry.plan import Outcome, StepFailure, backoff_s, decide_step
from hyperpod_agent.controller.store.rows import ActionRow, FaultRow
from hyperpod_agent.slurm.models import Job, Node

SPARE5 = node("node5", flags=("DRAIN",), reason="hyperpod:spare")
XID79 = fault("node2", component="gpu3", code="xid79", action="REBOOT", urgent=True)
XID13 = fault("node2", component="gpu3", code="xid13", action="MONITOR")
OURS2 = node("node2", flags=("DRAIN",), reason="hyperpod:drain agent x")
THREE_DOWN = {f"node{i}": node(f"node{i}", state="DOWN") for i in (6, 7, 8)}
DEAD2 = node("node2", state="DOWN", flags=("NOT_RESPONDING",), reason="Not responding")
JOB = Job(
    job_id=12,
    name="train",
    state="RUNNING",
    nodes=("node1", "node2", "node3"),
    auto_resume=3,
    partition="main",
)
FAILURE = StepFailure(12, "0", 1, ("node1", "node2", "node3"), 1)
PARKED1 = node("node1", state="ALLOCATED", flags=("DRAIN",), reason="hyperpod:replace gpu0 xid79 x")
ADMINS_SPARE = node("node5", flags=("DRAIN",), reason="hyperpod:spare", partitions=("admins",))
NODE2_TWO_PARTS = node("node2", partitions=("main", "admins"))


@dataclass
class Case:
    id: str
    outcome: Outcome
    says: str
    job: Job = JOB
    failure: StepFailure = FAILURE
    faults: Sequence[FaultRow] = (XID79,)
    changes: Mapping[str, Node] = field(default_factory=lambda: {"node5": SPARE5})
    cfg: dict[str, dict[str, object]] = field(default_factory=dict)
    done: int = 0
    last_minute: int = 0
    requeues: int = 0
    in_flight: Sequence[ActionRow] = ()
    markers: Mapping[str, int] = field(default_factory=dict)  # node -> srun marker of job 12


CASES = [
    Case("urgent fault and a spare", Outcome.RETRYSTEP, "gpu3 xid79 on node2: node5 stands in"),
    # Slurm keeps a dead node's part of the step RUNNING: no new step could start
    Case("dead node", Outcome.REQUEUE, "node2 not responding (DOWN); the step stays on the dead",
         faults=(), changes={"node5": SPARE5, "node2": DEAD2}),
    Case("slurmd gone, its agent says", Outcome.REQUEUE, "the step stays on the dead node",
         faults=(fault("node2", component="slurmd", code="slurmd_down", action="REBOOT",
                       urgent=True),)),
    Case("out under our reason", Outcome.RETRYSTEP, "node2 out under 'hyperpod:drain agent x'",
         faults=(), changes={"node5": SPARE5, "node2": OURS2}),
    Case("closed fault within the window", Outcome.RETRYSTEP, "xid79 on node2",
         faults=(replace(XID79, closed_at=NOW - 5, last_seen=NOW - 10),)),
    Case("closed fault long ago", Outcome.FAIL, "on healthy nodes",
         faults=(replace(XID79, closed_at=NOW - 5000, last_seen=NOW - 5000),)),
    # a fault the node had, and got over, before this launch of the step began is not
    # what ended it (a node repaired and resumed, then an application error)
    Case("closed fault before the step began", Outcome.FAIL, "on healthy nodes",
         faults=(replace(XID79, closed_at=NOW - 20, last_seen=NOW - 30),),
         failure=replace(FAILURE, started_at=NOW - 15)),
    Case("closed fault after the step began", Outcome.RETRYSTEP, "xid79 on node2",
         faults=(replace(XID79, closed_at=NOW - 5, last_seen=NOW - 10),),
         failure=replace(FAILURE, started_at=NOW - 15)),
    Case("monitor fault is the application's", Outcome.FAIL, "healthy nodes", faults=(XID13,)),
    Case("healthy nodes", Outcome.FAIL, "step 0 failed (exit 1) on healthy nodes", faults=()),
    Case("exit 93", Outcome.FAIL, "exit 93", failure=replace(FAILURE, exit_code=93)),
    Case("cancelled", Outcome.FAIL, "step 0 was cancelled",
         failure=replace(FAILURE, cancelled=True)),
    Case("not opted in", Outcome.FAIL, "did not opt in", job=replace(JOB, auto_resume=None)),
    # the application's answers come first: an srun's marker may not have arrived yet
    Case("not opted in, on healthy nodes", Outcome.FAIL, "on healthy nodes",
         job=replace(JOB, auto_resume=None), faults=()),
    Case("opted in by the srun's marker", Outcome.RETRYSTEP, "node5 stands in",
         job=replace(JOB, auto_resume=None), markers={"node1": 2}),
    Case("a marker from a node not the job's", Outcome.FAIL, "did not opt in",
         job=replace(JOB, auto_resume=None), markers={"node7": 2}),
    Case("auto-resume off", Outcome.FAIL, "disabled", cfg={"auto_resume": {"enabled": False}}),
    Case("a node not the job's", Outcome.FAIL, "node9 not among job 12's nodes",
         failure=replace(FAILURE, nodes=("node1", "node9"))),
    # sbatch --no-kill: Slurm took the dead node out of the job itself; it is the bad one
    Case("a dead node Slurm released", Outcome.REQUEUE, "the step stays on the dead node",
         job=replace(JOB, nodes=("node1", "node3")), faults=(),
         changes={"node5": SPARE5, "node2": DEAD2}),
    Case("no spare", Outcome.REQUEUE, "no spare left in partitions main", changes={}),
    Case("spare not ready", Outcome.REQUEUE, "node5: not responding",
         changes={"node5": replace(SPARE5, flags=frozenset({"DRAIN", "NOT_RESPONDING"}))}),
    Case("named its nodes", Outcome.REQUEUE, "the job named its nodes (node1,node2,node3)",
         job=replace(JOB, extra={"required_nodes": "node[1-3]"})),
    Case("budget spent by attempts", Outcome.REQUEUE, "in-place budget spent (3/3)",
         failure=replace(FAILURE, attempt=4)),
    Case("budget spent by the store's count", Outcome.REQUEUE, "in-place budget spent (3/3)",
         done=3),
    Case("the plain switch is worth default_attempts", Outcome.RETRYSTEP, "stands in",
         job=replace(JOB, auto_resume=1), failure=replace(FAILURE, attempt=3),
         cfg={"auto_resume": {"default_attempts": 5}}),
    # the spare joins the job: from the job's partition, not any of the broken node's
    Case("a spare only in a partition the job does not run in", Outcome.REQUEUE,
         "no spare left in partitions main",
         changes={"node5": ADMINS_SPARE, "node2": NODE2_TWO_PARTS}),
    Case("a job whose partition Slurm does not name", Outcome.REQUEUE, "names no partition",
         job=replace(JOB, partition="")),
    Case("two faulty nodes", Outcome.REQUEUE, "an in-place retry replaces one",
         faults=(XID79, replace(XID79, id=77, node="node3"))),
    Case("job not running", Outcome.REQUEUE, "job is COMPLETING, not RUNNING",
         job=replace(JOB, state="COMPLETING")),
    Case("a requeue already under way", Outcome.REQUEUE, "a job-level requeue is under way",
         in_flight=(action_row("requeue", None, state="intent", job_id=12),)),
    Case("cluster cap", Outcome.REQUEUE, "cluster-wide cap (2/min) reached",
         cfg={"auto_resume": {"max_requeues_per_minute": 2}}, last_minute=1, requeues=1),
    Case("blast radius", Outcome.REQUEUE, "blast radius: partition main",
         changes={"node5": SPARE5, **THREE_DOWN},
         failure=replace(FAILURE, nodes=("node2",)),
         cfg={"policy": {"max_unhealthy_fraction": 0.5, "min_unhealthy_nodes": 1}}),
    Case("shared cause", Outcome.REQUEUE, "shared cause: xid79",
         faults=(XID79, replace(XID79, id=78, node="node6"), replace(XID79, id=79, node="node7")),
         failure=replace(FAILURE, nodes=("node2",))),
    Case("no spare pool", Outcome.REQUEUE, "no spare pool (provider command)",
         cfg={"provider": {"kind": "command", "command": ["/bin/true"]}}),
    Case("the fault on the batch host", Outcome.RETRYSTEP,
         "node5 stands in; node2 stays as the batch host only",
         job=replace(JOB, batch_host="node2")),
    Case("the batch host dead", Outcome.REQUEUE, "the job's batch host is dead",
         job=replace(JOB, batch_host="node2"), faults=(),
         changes={"node5": SPARE5, "node2": DEAD2}),
    Case("the batch host out already", Outcome.REQUEUE,
         "batch host node1 is out already (an earlier retry)",
         job=replace(JOB, batch_host="node1"), failure=replace(FAILURE, nodes=("node2", "node3")),
         changes={"node5": SPARE5, "node1": PARKED1}),
    Case("the batch host elsewhere", Outcome.RETRYSTEP, "node5 stands in",
         job=replace(JOB, batch_host="node1")),
]  # fmt: skip


def snapshot(c: Case) -> Snapshot:
    nodes = cluster(8)
    nodes.update(c.changes)
    health = {n: healthy() for n in nodes}
    health.update({f.node: faulty() for f in c.faults if f.closed_at is None})
    for name, cap in c.markers.items():
        health[name] = replace(health[name], jobs_opted_in={12: cap})
    return Snapshot(
        nodes=nodes,
        jobs=[c.job],
        health=health,
        open_faults=[f for f in c.faults if f.closed_at is None],
        history=c.faults,
        started_at=NOW - 3600,
        requeues_last_minute=c.requeues,
        in_flight=c.in_flight,
    )


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_decision(c: Case) -> None:
    plan = decide_step(c.job, c.failure, snapshot(c), config(**c.cfg), NOW, c.done, c.last_minute)
    assert (plan.outcome, c.says in plan.cause) == (c.outcome, True), plan.cause
    assert "\n" not in plan.cause


def test_a_retry_names_the_node_its_spare_and_the_replace_reason() -> None:
    plan = decide_step(JOB, FAILURE, snapshot(CASES[0]), config(), NOW)
    assert (plan.bad_node, plan.spare, plan.keep) == ("node2", "node5", ("node1", "node3"))
    assert plan.reason == "hyperpod:replace gpu3 xid79 boom"


def test_a_fault_on_the_batch_host_keeps_it_in_the_job_and_the_step_off_it() -> None:
    job = replace(JOB, batch_host="node2")
    plan = decide_step(job, FAILURE, snapshot(CASES[0]), config(), NOW)
    assert (plan.bad_node, plan.spare) == ("node2", "node5")
    assert plan.keep == ("node1", "node2", "node3")  # not shrunk: Slurm keeps a batch host
    assert plan.reason == "hyperpod:replace gpu3 xid79 boom"  # nothing else lands on it


def test_a_node_out_under_our_reason_keeps_its_component_and_code() -> None:
    c = next(c for c in CASES if c.id == "out under our reason")
    plan = decide_step(JOB, FAILURE, snapshot(c), config(), NOW)
    assert plan.reason == "hyperpod:replace agent x step retry of job 12"


def test_a_spare_under_another_surgery_is_not_promised_again() -> None:
    snap = replace(snapshot(CASES[0]), step_retries={44: ("node7", "node5")})
    plan = decide_step(JOB, FAILURE, snap, config(), NOW)
    assert plan.outcome is Outcome.REQUEUE and "no spare" in plan.cause


def test_retries_of_the_same_step_back_off_as_requeues_do() -> None:
    ar = config(auto_resume={"backoff_base_s": 10, "backoff_max_s": 25}).auto_resume
    assert backoff_s([], NOW, ar) == 0.0  # the first retry goes at once
    assert backoff_s([NOW - 4], NOW, ar) == 6.0  # the second waits 10 s after the first
    assert backoff_s([NOW - 30, NOW - 4], NOW, ar) == 16.0  # then 20 s
    assert backoff_s([NOW - 90, NOW - 60, NOW - 1], NOW, ar) == 24.0  # capped at 25 s
    assert backoff_s([NOW - 60], NOW, ar) == 0.0  # long past


def test_a_parked_batch_host_runs_no_step_of_its_job_again() -> None:
    """After a retry that kept the bad batch host, the job's steps are watched (and
    judged) on its other nodes only: the parked node's open fault ends none of them."""
    from hyperpod_agent.controller.api.steps import step_nodes_of

    job = replace(JOB, batch_host="node1", nodes=("node1", "node3", "node5"))
    nodes = cluster(8)
    assert step_nodes_of(job, nodes) == ("node1", "node3", "node5")
    nodes["node1"] = PARKED1
    assert step_nodes_of(job, nodes) == ("node3", "node5")
    # drained by a human, or by us for another reason: not a parked batch host
    nodes["node1"] = node("node1", flags=("DRAIN",), reason="maintenance by ann")
    assert step_nodes_of(job, nodes) == ("node1", "node3", "node5")
    nodes["node1"] = node("node1", flags=("DRAIN",), reason="hyperpod:drain agent x")
    assert step_nodes_of(job, nodes) == ("node1", "node3", "node5")
