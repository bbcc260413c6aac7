"""Auto-resume rules (DESIGN §4), table-driven."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pytest
from ctl_helpers import NOW, action_row, cluster, config, fault, healthy, job, node, ts

from hyperpod_agent.controller.autoresume import cap_of, plan
from hyperpod_agent.controller.snapshot import Kind, NodeHealth, Snapshot
from hyperpod_agent.controller.store.rows import FaultRow, TrackedJob
from hyperpod_agent.health import Verdict
from hyperpod_agent.slurm.models import Job, Node


@dataclass
class Case:
    id: str
    jobs: Sequence[Job]
    expected: list[tuple[str, int]]
    urgent: set[str] = field(default_factory=set)
    open_faults: Sequence[FaultRow] = ()
    history: Sequence[FaultRow] = ()
    tracked: Mapping[int, TrackedJob] = field(default_factory=dict)
    changes: Mapping[str, Node] = field(default_factory=dict)
    cfg: dict[str, object] = field(default_factory=dict)
    requeues_last_minute: int = 0
    in_flight_jobs: Sequence[int] = ()
    events: Sequence[str] = ()


def run(c: Case) -> tuple[list[tuple[str, int]], list[str]]:
    nodes = cluster(4)
    nodes.update(c.changes)
    faults: dict[str, list[FaultRow]] = {}
    for f in c.open_faults:
        faults.setdefault(f.node, []).append(f)
    snap = Snapshot(
        nodes=nodes,
        jobs=c.jobs,
        health={n: healthy() for n in nodes},
        open_faults=c.open_faults,
        history=list(c.history) + list(c.open_faults),
        in_flight=[action_row("requeue", None, state="intent", job_id=j) for j in c.in_flight_jobs],
        tracked=c.tracked,
        requeues_last_minute=c.requeues_last_minute,
    )
    actions, events = plan(snap, config(auto_resume=c.cfg), NOW, c.urgent, faults)
    return [(a.kind.value, int(a.job_id or 0)) for a in actions], [e.kind for e in events]


def tracked(
    job_id: int,
    attempts: int,
    last: float | None = None,
    state: str = "requeued",
    acted: int | None = None,
    cap: int = 3,
) -> dict[int, TrackedJob]:
    return {job_id: TrackedJob(job_id, cap, attempts, "x", state, last, acted, None, NOW)}


CASES = [
    Case(
        "running job on an urgent node -> requeue",
        [job(7, nodes=("node1", "node2"))],
        [("requeue", 7)],
        urgent={"node2"},
    ),
    Case("running job elsewhere -> nothing", [job(7, nodes=("node1",))], [], urgent={"node2"}),
    Case(
        "not opted in -> nothing",
        [job(7, nodes=("node2",), auto_resume=None)],
        [],
        urgent={"node2"},
    ),
    Case("NODE_FAIL -> requeue", [job(7, state="NODE_FAIL")], [("requeue", 7)]),
    Case(
        "FAILED 233 on a node with an open fault -> requeue",
        [job(7, state="FAILED", nodes=("node2",), exit_code=233)],
        [("requeue", 7)],
        open_faults=[fault("node2")],
    ),
    Case(
        "FAILED with only an application-error fault (xid13, MONITOR) -> not retried",
        [job(7, state="FAILED", nodes=("node2",), exit_code=1)],
        [("not_retried", 7)],
        open_faults=[fault("node2", code="xid13", action="MONITOR")],
        history=[fault("node2", code="xid31", action="MONITOR", first_seen=NOW - 60)],
    ),
    Case(
        "FAILED after a recent (closed) fault -> requeue",
        [job(7, state="FAILED", nodes=("node2",), exit_code=1)],
        [("requeue", 7)],
        history=[fault("node2", first_seen=NOW - 120, closed_at=NOW - 60, last_seen=NOW - 60)],
    ),
    Case(
        # a node repaired and put back before the job started: its old fault did not
        # end this job (an application error did)
        "FAILED, its node's fault over before the job started -> not retried",
        [replace(job(7, state="FAILED", nodes=("node2",), exit_code=1), start_time=ts(NOW - 30))],
        [("not_retried", 7)],
        history=[fault("node2", first_seen=NOW - 120, closed_at=NOW - 60, last_seen=NOW - 60)],
    ),
    Case(
        "FAILED, fault long ago -> not retried",
        [job(7, state="FAILED", nodes=("node2",), exit_code=1)],
        [("not_retried", 7)],
        history=[fault("node2", first_seen=NOW - 5000, closed_at=NOW - 4000, last_seen=NOW - 4000)],
    ),
    Case(
        "FAILED long before a fault on its node appeared -> not retried",
        [replace(job(7, state="FAILED", nodes=("node2",), exit_code=1), end_time=ts(NOW - 900))],
        [("not_retried", 7)],
        open_faults=[fault("node2", first_seen=NOW - 5)],
    ),
    Case(
        "FAILED, its node's fault reported just after the failure -> requeue",
        [replace(job(7, state="FAILED", nodes=("node2",), exit_code=1), end_time=ts(NOW - 20))],
        [("requeue", 7)],
        open_faults=[fault("node2", first_seen=NOW - 5)],
    ),
    Case(
        "FAILED long before we drained its node -> not retried",
        [replace(job(7, state="FAILED", nodes=("node2",), exit_code=1), end_time=ts(NOW - 900))],
        [("not_retried", 7)],
        changes={
            "node2": node(
                "node2", flags=("DRAIN",), reason="hyperpod:reboot gpu0 x", reason_time=NOW - 5
            )
        },
    ),
    Case(
        "FAILED on a node we drained -> requeue",
        [job(7, state="FAILED", nodes=("node2",))],
        [("requeue", 7)],
        changes={"node2": node("node2", flags=("DRAIN",), reason="hyperpod:reboot gpu0 x")},
    ),
    Case(
        "FAILED on a dead node -> requeue",
        [job(7, state="FAILED", nodes=("node2",), exit_code=233)],
        [("requeue", 7)],
        changes={"node2": node("node2", state="DOWN", flags=("NOT_RESPONDING",))},
    ),
    Case(
        "FAILED on healthy nodes -> not retried by default, said once",
        [job(7, state="FAILED", nodes=("node2",), exit_code=1)],
        [("not_retried", 7)],
    ),
    Case(
        "FAILED on healthy nodes, already said -> nothing",
        [job(7, state="FAILED", nodes=("node2",), exit_code=1)],
        [],
        tracked=tracked(7, 0, state="failed"),
    ),
    Case(
        "failed again on healthy nodes after a requeue -> said again",
        [job(7, state="FAILED", nodes=("node2",), exit_code=1, restart_count=1)],
        [("not_retried", 7)],
        tracked=tracked(7, 1, last=NOW - 600, acted=0),
    ),
    Case(
        "not retried earlier, then a fault shows on its node -> requeue",
        [job(7, state="FAILED", nodes=("node2",), exit_code=233)],
        [("requeue", 7)],
        open_faults=[fault("node2")],
        tracked=tracked(7, 0, state="failed"),
    ),
    Case(
        "FAILED, not opted in -> nothing said",
        [job(7, state="FAILED", nodes=("node2",), exit_code=1, auto_resume=None)],
        [],
    ),
    Case(
        "FAILED on healthy nodes with retry_on=any_failure -> requeue",
        [job(7, state="FAILED", nodes=("node2",), exit_code=1)],
        [("requeue", 7)],
        cfg={"retry_on": "any_failure"},
    ),
    Case(
        "COMPLETED / CANCELLED / TIMEOUT -> nothing",
        [job(7, state="COMPLETED"), job(8, state="CANCELLED"), job(9, state="TIMEOUT")],
        [],
        cfg={"retry_on": "any_failure"},
    ),
    Case(
        "budget spent -> exhaust once",
        [job(7, state="NODE_FAIL")],
        [("exhaust", 7)],
        tracked=tracked(7, 3, last=NOW - 5000, acted=-1),
    ),
    Case(
        "already exhausted -> nothing",
        [job(7, state="NODE_FAIL")],
        [],
        tracked=tracked(7, 3, state="exhausted"),
    ),
    Case(
        "back-off not over -> wait, one event",
        [job(7, state="NODE_FAIL", restart_count=1)],
        [],
        tracked=tracked(7, 1, last=NOW - 5, acted=0),
        events=["requeue_backoff"],
    ),
    Case(
        "back-off over -> requeue",
        [job(7, state="NODE_FAIL", restart_count=1)],
        [("requeue", 7)],
        tracked=tracked(7, 1, last=NOW - 11, acted=0),
    ),
    Case(
        "back-off doubles per attempt",
        [job(7, state="NODE_FAIL", restart_count=2)],
        [],
        tracked=tracked(7, 2, last=NOW - 15, acted=1),
        events=["requeue_backoff"],
    ),
    Case(
        "back-off is capped",
        [job(7, state="NODE_FAIL", restart_count=2)],
        [("requeue", 7)],
        tracked=tracked(7, 2, last=NOW - 6, acted=1, cap=9),
        cfg={"backoff_base_s": 5, "backoff_max_s": 5},
    ),
    Case(
        "this failure was already requeued -> nothing",
        [job(7, state="NODE_FAIL")],
        [],
        tracked=tracked(7, 1, last=NOW - 600, acted=0),
    ),
    Case("a requeue in flight -> nothing", [job(7, state="NODE_FAIL")], [], in_flight_jobs=[7]),
    Case(
        "cluster-wide cap reached -> wait, one event",
        [job(7, state="NODE_FAIL"), job(8, state="NODE_FAIL")],
        [],
        requeues_last_minute=20,
        events=["requeue_capped"],
    ),
    Case(
        "cap leaves room for one",
        [job(7, state="NODE_FAIL"), job(8, state="NODE_FAIL")],
        [("requeue", 7)],
        requeues_last_minute=19,
        events=["requeue_capped"],
    ),
    Case("disabled -> nothing", [job(7, state="NODE_FAIL")], [], cfg={"enabled": False}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_autoresume_rules(case: Case) -> None:
    actions, events = run(case)
    assert actions == case.expected
    assert events == list(case.events)


def test_requeue_params_carry_the_restart_count() -> None:
    c = Case("x", [job(7, state="NODE_FAIL", restart_count=4)], [])
    nodes = cluster(2)
    snap = Snapshot(nodes=nodes, jobs=c.jobs)
    [a], _ = plan(snap, config(), NOW, set(), {})
    assert a.kind is Kind.REQUEUE and a.params["restart_count"] == 4
    assert a.params["attempt"] == 1 and a.cause == "job ended NODE_FAIL"


@pytest.mark.parametrize(
    ("slurm_value", "agent_value", "expected"),
    [
        (None, None, None),
        (1, None, 3),
        (5, None, 5),
        (None, 2, 2),
        (None, 1, 3),
        (2, 6, 6),
        (0, None, None),
        (None, 2**70, 1000),
    ],
)
def test_cap_of(slurm_value: int | None, agent_value: int | None, expected: int | None) -> None:
    health = {
        "node1": NodeHealth(
            Verdict.HEALTHY, NOW, NOW, {7: agent_value} if agent_value is not None else {}
        )
    }
    snap = Snapshot(nodes=cluster(1), health=health)
    assert cap_of(job(7, auto_resume=slurm_value), snap, 3) == expected


def test_an_srun_marker_counts_only_from_the_jobs_own_nodes() -> None:
    # node3 does not run job 7: its report cannot opt job 7 in (or raise its budget).
    health = {
        "node1": NodeHealth(Verdict.HEALTHY, NOW, NOW, {}),
        "node3": NodeHealth(Verdict.HEALTHY, NOW, NOW, {7: 50}),
    }
    snap = Snapshot(nodes=cluster(3), health=health)
    assert cap_of(job(7, auto_resume=None, nodes=("node1",)), snap, 3) is None
    assert cap_of(job(7, auto_resume=2, nodes=("node1",)), snap, 3) == 2
    assert cap_of(job(7, auto_resume=None, nodes=("node1", "node3")), snap, 3) == 50
