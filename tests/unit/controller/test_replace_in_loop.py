"""Replacement in the loop: an urgent fault under an auto-resume job swaps in a spare.

Table-driven over the whole pure policy (``decide``), because the node rule, the
spare promise, the blast radius and the requeue in the same pass work together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from ctl_helpers import NOW, cluster, config, fault, faulty, healthy, job, node

from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.replacement import SparePool
from hyperpod_agent.controller.snapshot import Decision, Kind, Snapshot
from hyperpod_agent.controller.store.rows import FaultRow, TrackedJob
from hyperpod_agent.slurm.models import Job, Node

DRAINED = ("DRAIN",)
SPARE5 = node("node5", state="IDLE", flags=DRAINED, reason="hyperpod:spare")
NODE4 = node("node4", flags=DRAINED, reason="hyperpod:reboot gpu0 xid79 x")
NODE4_OUT = fault("node4")  # still faulty: stays out
XID79 = fault("node2", component="gpu3", code="xid79", action="REBOOT", urgent=True)


@dataclass
class Case:
    id: str
    expected: list[tuple[str, str]]  # (kind, node or job id)
    jobs: Sequence[Job] = (job(12, nodes=("node1", "node2")),)
    faults: Sequence[FaultRow] = (XID79,)
    changes: Mapping[str, Node] = field(default_factory=lambda: {"node5": SPARE5})
    tracked: Mapping[int, TrackedJob] = field(default_factory=dict)
    cfg: dict[str, dict[str, object]] = field(default_factory=dict)
    incident: bool = False


def run(c: Case) -> Decision:
    nodes = cluster(4)
    nodes.update(c.changes)
    health = {n: healthy() for n in nodes}
    health.update({f.node: faulty() for f in c.faults})
    snap = Snapshot(
        nodes=nodes,
        jobs=c.jobs,
        health=health,
        open_faults=c.faults,
        history=c.faults,
        tracked=c.tracked,
        started_at=NOW - 3600,
    )
    return decide(snap, config(**c.cfg), NOW)


def targets(d: Decision) -> list[tuple[str, str]]:
    return [(a.kind.value, str(a.job_id if a.job_id is not None else a.node)) for a in d.actions]


CASES = [
    Case(
        "urgent fault under an auto-resume job, spare free -> replace and requeue",
        [("replace", "node2"), ("requeue", "12")],
    ),
    Case(
        "no spare -> reboot and requeue as before",
        [("reboot", "node2"), ("requeue", "12")],
        changes={},
    ),
    Case(
        "spare not responding -> reboot",
        [("reboot", "node2"), ("requeue", "12")],
        changes={
            "node5": node(
                "node5", state="DOWN", flags=(*DRAINED, "NOT_RESPONDING"), reason="hyperpod:spare"
            )
        },
    ),
    Case(
        "spare in another partition -> reboot",
        [("reboot", "node2"), ("requeue", "12")],
        changes={
            "node5": node("node5", flags=DRAINED, reason="hyperpod:spare", partitions=("other",))
        },
    ),
    Case(
        "job not opted in -> reboot, spare kept",
        [("reboot", "node2")],
        jobs=[job(12, nodes=("node1", "node2"), auto_resume=None)],
    ),
    Case(
        "job asked for this node by name (-w) -> reboot, a spare cannot stand in",
        [("reboot", "node2"), ("requeue", "12")],
        jobs=[
            Job(
                job_id=12,
                name="j",
                state="RUNNING",
                nodes=("node2",),
                auto_resume=1,
                extra={"required_nodes": "node2"},
            )
        ],
    ),
    Case("no job on the node -> reboot", [("reboot", "node2")], jobs=[job(12, nodes=("node1",))]),
    Case(
        "job pending, not running -> reboot",
        [("reboot", "node2")],
        jobs=[job(12, state="PENDING", nodes=())],
    ),
    Case(
        "deferred fault -> reboot, the job may finish",
        [("reboot", "node2")],
        faults=[fault("node2", code="xid79", action="REBOOT", urgent=False)],
    ),
    Case(
        "urgent RESET fault -> replace too",
        [("replace", "node2"), ("requeue", "12")],
        faults=[fault("node2", code="xid74", action="RESET", urgent=True)],
    ),
    Case(
        "REPLACE fault -> replace, as before",
        [("replace", "node2"), ("requeue", "12")],
        faults=[fault("node2", code="xid54", action="REPLACE", urgent=True)],
    ),
    Case(
        "job's budget spent -> reboot, no requeue coming",
        [("reboot", "node2")],
        tracked={12: TrackedJob(12, 3, 3, "x", "exhausted", NOW - 900, 2, None, NOW)},
    ),
    Case(
        "job's budget used up but not yet marked -> reboot and exhaust",
        [("reboot", "node2"), ("exhaust", "12")],
        tracked={12: TrackedJob(12, 3, 3, "x", "requeued", NOW - 900, -1, None, NOW)},
    ),
    Case(
        "auto-resume disabled -> reboot",
        [("reboot", "node2")],
        cfg={"auto_resume": {"enabled": False}},
    ),
    Case(
        "command provider brings no other node -> reboot",
        [("reboot", "node2"), ("requeue", "12")],
        cfg={"provider": {"kind": "command", "command": ["/bin/true"]}},
    ),
    Case(
        "two faulty nodes, one spare -> the first is replaced, the second rebooted",
        [("replace", "node2"), ("reboot", "node3"), ("requeue", "12"), ("requeue", "13")],
        jobs=[job(12, nodes=("node1", "node2")), job(13, nodes=("node3",))],
        faults=[XID79, fault("node3", code="xid79", action="REBOOT", urgent=True)],
        cfg={"policy": {"min_unhealthy_nodes": 2}},
    ),
    Case(
        "a replacement does not count toward the blast radius",
        [("replace", "node2"), ("requeue", "12")],
        faults=[XID79, NODE4_OUT],
        changes={"node5": SPARE5, "node4": NODE4},
    ),
    Case(
        "the same take-out without a spare is over the limit -> incident",
        [],
        faults=[XID79, NODE4_OUT],
        changes={"node4": NODE4},
        incident=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_replacement_in_the_loop(case: Case) -> None:
    decision = run(case)
    assert targets(decision) == case.expected
    assert decision.incident is case.incident


def test_replacement_names_the_job_the_spare_and_the_fault() -> None:
    [replace, requeue] = run(CASES[0]).actions
    assert replace.kind is Kind.REPLACE and replace.urgent and replace.takes_out
    assert replace.cause == "urgent gpu3 xid79 under auto-resume job 12: replace with a spare"
    assert replace.reason.startswith("hyperpod:replace gpu3 xid79")
    assert replace.params["spare"] == "node5" and replace.params["job_id"] == 12
    assert requeue.cause == "urgent fault on node2"


def test_escalated_replacement_is_promised_a_spare() -> None:
    decision = run(Case("x", [], jobs=[], faults=[fault("node2", code="xid54", action="REPLACE")]))
    [replace] = decision.actions
    assert replace.params["spare"] == "node5"


def test_spare_pool_promises_each_spare_once() -> None:
    nodes = cluster(2)
    nodes["node8"] = node("node8", flags=DRAINED, reason="hyperpod:spare", partitions=("b",))
    nodes["node9"] = node("node9", flags=DRAINED, reason="hyperpod:spare")
    snap = Snapshot(nodes=nodes, health={n: healthy() for n in nodes})
    pool = SparePool(snap, config().policy, NOW)
    assert pool.take(nodes["node1"]) == "node9"
    assert pool.take(nodes["node2"]) is None
    assert pool.take(node("x", partitions=("b",))) == "node8"
