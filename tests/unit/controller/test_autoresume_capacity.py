"""The capacity guard: a job is requeued only when it can run somewhere. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from ctl_helpers import NOW, cluster, config, fault, faulty, healthy, job, node

from hyperpod_agent.controller.autoresume import job_partitions, plan, usable_nodes
from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.snapshot import Kind, PlannedAction, PlannedEvent, Snapshot
from hyperpod_agent.slurm.models import Job, Node

DRAINED = ("DRAIN",)
OURS = node("nodeX", flags=DRAINED, reason="hyperpod:reboot gpu0 xid79 x")
HUMAN = node("nodeX", flags=DRAINED, reason="maintenance")
SPARE = node("node5", flags=DRAINED, reason="hyperpod:spare")
DEAD = node("nodeX", state="IDLE", flags=("NOT_RESPONDING",))


def as_(n: Node, name: str) -> Node:
    return Node(**{**n.__dict__, "name": name})


def take_out(name: str, kind: Kind = Kind.DRAIN) -> PlannedAction:
    return PlannedAction(kind, name, "hyperpod:drain x y", "test", takes_out=True)


def replace_with(name: str, spare: str) -> PlannedAction:
    return PlannedAction(
        Kind.REPLACE, name, "hyperpod:replace x y", "test", takes_out=True, params={"spare": spare}
    )


def pinned(expr: str) -> Job:
    return Job(
        job_id=7,
        name="j",
        state="NODE_FAIL",
        nodes=("node1", "node2"),
        auto_resume=3,
        extra={"required_nodes": expr},
    )


@dataclass
class Case:
    id: str
    usable: int
    expected: list[str]  # "requeue" or the waiting event's message
    jobs: Sequence[Job] = (job(7, state="NODE_FAIL", nodes=("node1", "node2")),)
    changes: Mapping[str, Node] = field(default_factory=dict)
    planned: Sequence[PlannedAction] = ()


CASES = [
    Case("all in service -> requeue", 4, ["requeue"]),
    Case(
        "its failed node out, three left -> requeue",
        3,
        ["requeue"],
        changes={"node2": as_(OURS, "node2")},
    ),
    Case(
        "only one usable of the two it needs -> wait",
        1,
        ["job 7 waits for capacity: needs 2 nodes in main, 1 usable"],
        changes={
            "node2": as_(OURS, "node2"),
            "node3": as_(HUMAN, "node3"),
            "node4": as_(DEAD, "node4"),
        },
    ),
    Case(
        "a spare promised in this pass counts -> requeue",
        2,
        ["requeue"],
        changes={"node3": as_(HUMAN, "node3"), "node4": as_(HUMAN, "node4"), "node5": SPARE},
        planned=[replace_with("node2", "node5")],
    ),
    Case(
        "a spare not promised does not count -> wait",
        1,
        ["job 7 waits for capacity: needs 2 nodes in main, 1 usable"],
        changes={
            "node2": as_(OURS, "node2"),
            "node3": as_(HUMAN, "node3"),
            "node4": as_(HUMAN, "node4"),
            "node5": SPARE,
        },
    ),
    Case(
        "a node resumed in this pass counts -> requeue",
        2,
        ["requeue"],
        changes={
            "node2": as_(OURS, "node2"),
            "node3": as_(OURS, "node3"),
            "node4": as_(HUMAN, "node4"),
        },
        planned=[PlannedAction(Kind.RESUME, "node3", "", "healthy")],
    ),
    Case(
        "nodes taken out in this pass do not count -> wait",
        1,
        ["job 7 waits for capacity: needs 2 nodes in main, 1 usable"],
        planned=[take_out("node2"), take_out("node3", Kind.REBOOT), take_out("node4", Kind.HOLD)],
    ),
    Case(
        "nodes of another partition do not count -> wait",
        1,
        ["job 7 waits for capacity: needs 2 nodes in main, 1 usable"],
        changes={
            "node2": as_(OURS, "node2"),
            "node3": node("node3", partitions=("other",)),
            "node4": node("node4", partitions=("other",)),
        },
    ),
    Case(
        "the job's own partition decides, not its nodes' -> wait",
        0,
        ["job 7 waits for capacity: needs 1 node in big, 0 usable"],
        jobs=[
            Job(
                job_id=7,
                name="j",
                state="NODE_FAIL",
                nodes=("node1",),
                auto_resume=3,
                partition="big",
            )
        ],
    ),
    Case(
        "asked for a node by name (-w) that is held for repair -> wait",
        3,
        ["job 7 waits for capacity: needs node2 (asked for by name), held for repair"],
        jobs=[pinned("node[1-2]")],
        changes={"node2": as_(node("x", flags=DRAINED, reason="hyperpod:replace gpu0 x"), "node2")},
    ),
    Case(
        "asked for a node by name that is replaced in this pass -> wait",
        4,
        ["job 7 waits for capacity: needs node2 (asked for by name), held for repair"],
        jobs=[pinned("node[1-2]")],
        planned=[replace_with("node2", "node5")],
        changes={"node5": SPARE},
    ),
    Case(
        "asked for a node by name that we reboot -> requeue, it comes back",
        3,
        ["requeue"],
        jobs=[pinned("node[1-2]")],
        changes={"node2": as_(OURS, "node2")},
    ),
    Case(
        "asked for nodes by name, all usable -> requeue",
        4,
        ["requeue"],
        jobs=[pinned("node[1-2]")],
    ),
    Case(
        "an unreadable required node list is Slurm's business -> requeue",
        4,
        ["requeue"],
        jobs=[pinned("node[1-")],
    ),
    Case(
        "a job without nodes needs one",
        4,
        ["requeue"],
        jobs=[job(7, state="NODE_FAIL", nodes=())],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_capacity_guard(case: Case) -> None:
    nodes = cluster(4)
    nodes.update(case.changes)
    snap = Snapshot(nodes=nodes, jobs=case.jobs, health={n: healthy() for n in nodes})
    assert usable_nodes(case.jobs[0], snap, case.planned) == case.usable
    actions, events = plan(snap, config(), NOW, set(), {}, case.planned)
    got = [a.kind.value for a in actions] + [e.message for e in events]
    assert got == case.expected
    for e in events:
        assert (e.kind, e.job_id, e.cause) == ("requeue_waiting", 7, "job ended NODE_FAIL")


def test_job_partitions_fall_back_to_its_nodes() -> None:
    nodes = {"a1": node("a1", partitions=("a", "b")), "c1": node("c1", partitions=("c",))}
    snap = Snapshot(nodes=nodes)
    assert job_partitions(job(1, nodes=("a1",)), snap) == {"a", "b"}
    assert job_partitions(Job(job_id=1, name="j", state="R", partition="x,y"), snap) == {"x", "y"}
    assert job_partitions(job(1, nodes=("gone",)), snap) == set()


def test_running_job_without_capacity_still_drains_and_waits() -> None:
    nodes = cluster(2)
    urgent = fault("node2", urgent=True)
    snap = Snapshot(
        nodes=nodes,
        jobs=[job(12, nodes=("node1", "node2"))],
        health={"node1": healthy(), "node2": faulty()},
        open_faults=[urgent],
        history=[urgent],
        started_at=NOW - 3600,
    )
    decision = decide(snap, config(), NOW)
    assert [(a.kind, a.node) for a in decision.actions] == [(Kind.REBOOT, "node2")]
    assert decision.events == [
        PlannedEvent(
            "requeue_waiting",
            "job 12 waits for capacity: needs 2 nodes in main, 1 usable",
            job_id=12,
            cause="urgent fault on node2",
        )
    ]


def test_waiting_job_is_requeued_once_capacity_exists() -> None:
    nodes = cluster(2)
    nodes["node2"] = node("node2", flags=DRAINED, reason="hyperpod:reboot gpu0 xid79 x")
    snap = Snapshot(nodes=nodes, jobs=[job(12, state="NODE_FAIL", nodes=("node1", "node2"))])
    assert plan(snap, config(), NOW, set(), {})[0] == []
    nodes["node3"] = node("node3")  # capacity arrives (a repaired node, a new machine)
    [requeue], events = plan(snap, config(), NOW, set(), {})
    assert requeue.kind is Kind.REQUEUE and events == []
