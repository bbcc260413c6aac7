"""Table-driven tests of the pure policy's node rules (DESIGN §2, §3, §7, §9)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pytest
from ctl_helpers import (
    NOW,
    action_row,
    cluster,
    config,
    fault,
    faulty,
    healthy,
    job,
    node,
)

from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.snapshot import Kind, NodeHealth, Snapshot
from hyperpod_agent.controller.store.rows import ActionRow, FaultRow
from hyperpod_agent.slurm.models import Job, Node


@dataclass
class Case:
    id: str
    expected: list[tuple[str, str, str]]  # (kind, node or job id, reason prefix)
    changes: Mapping[str, Node] = field(default_factory=dict)
    health: Mapping[str, NodeHealth] = field(default_factory=dict)
    open_faults: Sequence[FaultRow] = ()
    history: Sequence[FaultRow] = ()
    in_flight: Sequence[ActionRow] = ()
    done: Sequence[ActionRow] = ()
    jobs: Sequence[Job] = ()
    cfg: dict[str, dict[str, object]] = field(default_factory=dict)
    incident: bool = False
    started_at: float = NOW - 3600
    size: int = 10


def snap_of(c: Case) -> Snapshot:
    nodes = cluster(c.size)
    nodes.update(c.changes)
    health = {n: healthy() for n in nodes}
    health.update(c.health)
    history = list(c.history) + [f for f in c.open_faults if f not in c.history]
    return Snapshot(
        nodes=nodes,
        jobs=c.jobs,
        health=health,
        open_faults=c.open_faults,
        history=history,
        in_flight=c.in_flight,
        done=c.done,
        started_at=c.started_at,
    )


def summary(c: Case) -> tuple[list[tuple[str, str, str]], bool]:
    decision = decide(snap_of(c), config(**c.cfg), NOW)
    got = []
    for a in decision.actions:
        target = str(a.job_id) if a.job_id is not None else str(a.node)
        got.append((a.kind.value, target, a.reason))
    return got, decision.incident


def matches(got: list[tuple[str, str, str]], expected: list[tuple[str, str, str]]) -> bool:
    if len(got) != len(expected):
        return False
    return all(
        g[0] == e[0] and g[1] == e[1] and g[2].startswith(e[2])
        for g, e in zip(got, expected, strict=True)
    )


F2 = fault("node2")  # xid79 on gpu0, REBOOT, deferred
DRAINED = ("DRAIN",)

CASES = [
    Case("healthy cluster: nothing", []),
    Case(
        "faulty node -> reboot with owned reason",
        [("reboot", "node2", "hyperpod:reboot gpu0 xid79 boom")],
        health={"node2": faulty()},
        open_faults=[F2],
    ),
    Case(
        "RESET fault -> drain for reset",
        [("drain", "node2", "hyperpod:reset gpu0 xid46")],
        health={"node2": faulty()},
        open_faults=[fault("node2", code="xid46", action="RESET")],
    ),
    Case(
        "REPLACE fault -> provider",
        [("replace", "node2", "hyperpod:replace gpu0 xid54")],
        health={"node2": faulty()},
        open_faults=[fault("node2", code="xid54", action="REPLACE")],
    ),
    Case(
        "MONITOR fault -> nothing", [], open_faults=[fault("node2", code="xid13", action="MONITOR")]
    ),
    Case(
        "the strongest fault of a node wins",
        [("replace", "node2", "hyperpod:replace gpu1")],
        health={"node2": faulty()},
        open_faults=[fault("node2"), fault("node2", component="gpu1", action="REPLACE")],
    ),
    Case(
        "human maintenance drain is never touched",
        [],
        changes={"node2": node("node2", flags=DRAINED, reason="maintenance")},
        health={"node2": faulty()},
        open_faults=[F2],
    ),
    Case(
        "NHC drain is never resumed",
        [],
        changes={"node2": node("node2", flags=DRAINED, reason="NHC: check_fs_mount failed")},
    ),
    Case(
        "our reset drain + healthy -> resume",
        [("resume", "node2", "")],
        changes={"node2": node("node2", flags=DRAINED, reason="hyperpod:reset gpu0 xid46 x")},
    ),
    Case(
        "our drain + healthy but silent agent -> no resume",
        [],
        changes={"node2": node("node2", flags=DRAINED, reason="hyperpod:reset gpu0 xid46 x")},
        health={"node2": healthy(last_seen=NOW - 3600)},
    ),
    Case(
        "our drain + healthy but slurmd not responding -> no resume",
        [],
        changes={
            "node2": node(
                "node2",
                flags=("DRAIN", "NOT_RESPONDING"),
                reason="hyperpod:drain agent heartbeat_lost x",
            )
        },
    ),
    Case(
        "our drain + no report at all -> no resume",
        [],
        changes={"node2": node("node2", flags=DRAINED, reason="hyperpod:drain a b")},
        health={"node2": NodeHealth()},
    ),
    Case(
        "hold is never resumed",
        [],
        changes={"node2": node("node2", flags=DRAINED, reason="hyperpod:hold gpu0 lemon x")},
    ),
    Case(
        "replaced node is never resumed",
        [],
        changes={"node2": node("node2", flags=DRAINED, reason="hyperpod:replace gpu0 xid54")},
    ),
    Case(
        "spares are the pool, not patients",
        [],
        changes={"node10": node("node10", flags=DRAINED, reason="hyperpod:spare")},
        health={"node10": faulty()},
        open_faults=[fault("node10")],
    ),
    Case(
        "admin Action:Replace -> replace, canonical reason",
        [("replace", "node3", "hyperpod:replace admin request Action:Replace")],
        changes={
            "node3": node("node3", state="IDLE", flags=("DRAIN", "FAIL"), reason="Action:Replace")
        },
    ),
    Case(
        "admin ' action : reboot ' -> reboot",
        [("reboot", "node3", "hyperpod:reboot admin request action : reboot")],
        changes={"node3": node("node3", flags=("DRAIN", "FAIL"), reason=" action : reboot ")},
    ),
    Case(
        "no action on a node with an action in flight",
        [],
        health={"node2": faulty()},
        open_faults=[F2],
        in_flight=[action_row("drain", "node2", state="intent")],
    ),
    Case(
        "no action on a node with a reboot in flight",
        [],
        changes={
            "node2": node(
                "node2",
                flags=("DRAIN", "REBOOT_REQUESTED"),
                reason="hyperpod:reboot gpu0 xid79 boom",
            )
        },
        health={"node2": faulty()},
        open_faults=[F2],
    ),
    Case(
        "repeat within the window escalates REBOOT -> REPLACE",
        [("replace", "node2", "hyperpod:replace gpu0 xid79")],
        health={"node2": faulty()},
        open_faults=[F2],
        history=[fault("node2", first_seen=NOW - 1800, closed_at=NOW - 1700)],
    ),
    Case(
        "repeat outside the window does not escalate",
        [("reboot", "node2", "hyperpod:reboot gpu0 xid79")],
        health={"node2": faulty()},
        open_faults=[F2],
        history=[fault("node2", first_seen=NOW - 7200, closed_at=NOW - 7100)],
    ),
    Case(
        "another component's fault does not escalate",
        [("reboot", "node2", "hyperpod:reboot gpu0 xid79")],
        health={"node2": faulty()},
        open_faults=[F2],
        history=[fault("node2", component="gpu5", first_seen=NOW - 600, closed_at=NOW - 500)],
    ),
    Case(
        "RESET twice -> REBOOT",
        [("reboot", "node2", "hyperpod:reboot gpu0 xid46")],
        health={"node2": faulty()},
        open_faults=[fault("node2", code="xid46", action="RESET")],
        history=[
            fault("node2", code="xid46", action="RESET", first_seen=NOW - 900, closed_at=NOW - 800)
        ],
    ),
    Case(
        "fault still there after our reboot -> REPLACE",
        [("replace", "node2", "hyperpod:replace gpu0 xid79")],
        health={"node2": faulty()},
        open_faults=[fault("node2", first_seen=NOW - 300)],
        done=[action_row("reboot", "node2", updated_at=NOW - 200)],
    ),
    Case(
        "a reboot before the fault was first seen does not escalate",
        [("reboot", "node2", "hyperpod:reboot gpu0 xid79")],
        health={"node2": faulty()},
        open_faults=[fault("node2", first_seen=NOW - 100)],
        done=[action_row("reboot", "node2", updated_at=NOW - 200)],
    ),
    Case(
        "reset did not help within reset_timeout -> reboot",
        [("reboot", "node2", "hyperpod:reboot gpu0 xid46 still faulty")],
        changes={
            "node2": node(
                "node2", flags=DRAINED, reason="hyperpod:reset gpu0 xid46 x", reason_time=NOW - 700
            )
        },
        health={"node2": faulty()},
        open_faults=[fault("node2", code="xid46", action="RESET")],
    ),
    Case(
        "reset drain with jobs still running waits",
        [],
        changes={
            "node2": node(
                "node2",
                state="MIXED",
                flags=DRAINED,
                reason="hyperpod:reset gpu0 xid46 x",
                reason_time=NOW - 700,
            )
        },
        health={"node2": faulty()},
        open_faults=[fault("node2", code="xid46", action="RESET")],
    ),
    Case(
        "reset drain, still within reset_timeout: wait",
        [],
        changes={
            "node2": node(
                "node2", flags=DRAINED, reason="hyperpod:reset gpu0 xid46 x", reason_time=NOW - 100
            )
        },
        health={"node2": faulty()},
        open_faults=[fault("node2", code="xid46", action="RESET")],
    ),
    Case(
        "stronger fault while drained for reset -> replace",
        [("replace", "node2", "hyperpod:replace gpu0 xid54")],
        changes={"node2": node("node2", flags=DRAINED, reason="hyperpod:reset gpu0 xid46 x")},
        health={"node2": faulty()},
        open_faults=[fault("node2", code="xid54", action="REPLACE")],
    ),
    Case(
        "lemon: many faults in the window -> hold",
        [("hold", "node2", "hyperpod:hold gpu0 lemon")],
        health={"node2": faulty()},
        open_faults=[F2],
        history=[
            fault("node2", code="xid13", action="MONITOR", first_seen=NOW - 86400 * d)
            for d in (1, 2, 3, 4)
        ],
    ),
    Case(
        "lemon score without a current fault -> nothing",
        [],
        history=[
            fault("node2", code="xid13", action="MONITOR", first_seen=NOW - 86400 * d)
            for d in (1, 2, 3, 4, 5)
        ],
    ),
    Case(
        "report from before the last boot is ignored",
        [],
        changes={"node2": node("node2", boot_time=NOW - 30)},
        health={"node2": faulty(generated_at=NOW - 60)},
        open_faults=[F2],
    ),
    Case(
        "heartbeat lost + slurmd not responding -> drain",
        [("drain", "node2", "hyperpod:drain agent heartbeat_lost")],
        changes={"node2": node("node2", flags=("NOT_RESPONDING",))},
        health={"node2": healthy(last_seen=NOW - 600)},
    ),
    Case(
        "heartbeat lost + DOWN 'Not responding' (Slurm's own reason) -> drain",
        [("drain", "node2", "hyperpod:drain agent heartbeat_lost")],
        changes={
            "node2": node("node2", state="DOWN", flags=("NOT_RESPONDING",), reason="Not responding")
        },
        health={"node2": healthy(last_seen=NOW - 600)},
    ),
    Case(
        "a human's note that starts like Slurm's reason is the human's",
        [],
        changes={
            "node2": node(
                "node2", flags=DRAINED, reason="Not responding to IPMI - RMA 1234, keep out"
            ),
            "node3": node(
                "node3",
                flags=DRAINED,
                reason="Node unexpectedly rebooted - investigating, keep out",
            ),
        },
        health={"node2": faulty(), "node3": faulty()},
        open_faults=[fault("node2", urgent=True), fault("node3", urgent=True)],
        cfg={"policy": {"max_unhealthy_fraction": 0.5}},
    ),
    Case(
        "Slurm's exact reason: the fault is still acted on",
        [("reboot", "node2", "hyperpod:reboot gpu0 xid79")],
        changes={"node2": node("node2", flags=DRAINED, reason="Node unexpectedly rebooted")},
        health={"node2": faulty()},
        open_faults=[fault("node2", urgent=True)],
    ),
    Case(
        "heartbeat lost but Slurm says responding -> nothing",
        [],
        health={"node2": healthy(last_seen=NOW - 600)},
    ),
    Case(
        "heartbeat lost right after controller start -> nothing",
        [],
        changes={"node2": node("node2", flags=("NOT_RESPONDING",))},
        health={"node2": healthy(last_seen=NOW - 600)},
        started_at=NOW - 30,
    ),
    Case(
        "node never reported, not responding -> nothing",
        [],
        changes={"node2": node("node2", flags=("NOT_RESPONDING",))},
        health={"node2": NodeHealth()},
    ),
    Case(
        "heartbeat-drained node back and healthy -> resume",
        [("resume", "node2", "")],
        changes={
            "node2": node("node2", flags=DRAINED, reason="hyperpod:drain agent heartbeat_lost x")
        },
    ),
    # blast radius: 10 nodes at 10% -> 1 node may be out
    Case(
        "two new faulty nodes of ten -> incident, nothing drained",
        [],
        health={"node2": faulty(), "node3": faulty()},
        open_faults=[F2, fault("node3")],
        incident=True,
    ),
    Case(
        "one out by us + one new -> incident",
        [],
        changes={"node4": node("node4", flags=DRAINED, reason="hyperpod:hold gpu0 lemon x")},
        health={"node2": faulty()},
        open_faults=[F2],
        incident=True,
    ),
    Case(
        "out by a human counts: capacity is capacity",
        [],
        changes={"node4": node("node4", flags=DRAINED, reason="maintenance")},
        health={"node2": faulty()},
        open_faults=[F2],
        incident=True,
    ),
    Case(
        "down by Slurm counts too",
        [],
        changes={"node4": node("node4", state="DOWN", flags=("NOT_RESPONDING",))},
        health={"node2": faulty()},
        open_faults=[F2],
        incident=True,
    ),
    Case(
        "incident still resumes",
        [("resume", "node5", "")],
        changes={"node5": node("node5", flags=DRAINED, reason="hyperpod:reset gpu0 xid46 x")},
        health={"node2": faulty(), "node3": faulty()},
        open_faults=[F2, fault("node3")],
        incident=True,
    ),
    Case(
        "incident still honours admin requests",
        [("replace", "node6", "hyperpod:replace admin")],
        changes={"node6": node("node6", flags=("DRAIN", "FAIL"), reason="Action:Replace")},
        health={"node2": faulty(), "node3": faulty()},
        open_faults=[F2, fault("node3")],
        incident=True,
    ),
    Case(
        "a larger fraction allows more",
        [("reboot", "node2", ""), ("reboot", "node3", "")],
        health={"node2": faulty(), "node3": faulty()},
        open_faults=[F2, fault("node3")],
        cfg={"policy": {"max_unhealthy_fraction": 0.5}},
    ),
    Case(
        "min_unhealthy_nodes=0 on a small cluster -> incident for one",
        [],
        health={"node2": faulty()},
        open_faults=[F2],
        size=5,
        cfg={"policy": {"min_unhealthy_nodes": 0}},
        incident=True,
    ),
    Case(
        "escalation of a node already out is not a new take-out",
        [("replace", "node2", "hyperpod:replace gpu0 xid54")],
        changes={
            "node2": node("node2", flags=DRAINED, reason="hyperpod:reset gpu0 xid46 x"),
            "node3": node("node3", flags=DRAINED, reason="hyperpod:hold gpu0 lemon x"),
        },
        health={"node2": faulty()},
        open_faults=[fault("node2", code="xid54", action="REPLACE")],
    ),
    Case(
        "lemon on a node already out by us rewrites to hold (not a take-out)",
        [("hold", "node2", "hyperpod:hold")],
        changes={
            "node2": node("node2", flags=DRAINED, reason="hyperpod:reset gpu0 xid46 x"),
            "node3": node("node3", flags=DRAINED, reason="hyperpod:hold gpu0 lemon x"),
        },
        health={"node2": faulty()},
        open_faults=[fault("node2", code="xid46", action="RESET")],
        history=[
            fault("node2", code="xid13", action="MONITOR", first_seen=NOW - 3600 * d)
            for d in (1, 2, 3, 4)
        ],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_node_rules(case: Case) -> None:
    got, incident = summary(case)
    assert matches(got, case.expected), got
    assert incident is case.incident


def test_partition_limits_are_per_partition() -> None:
    nodes = {f"a{i}": node(f"a{i}", partitions=("a",)) for i in range(10)}
    nodes.update({f"b{i}": node(f"b{i}", partitions=("b",)) for i in range(10)})
    faults = [fault("a1"), fault("b1")]
    snap = Snapshot(
        nodes=nodes,
        health={n: healthy() for n in nodes},
        open_faults=faults,
        history=faults,
        started_at=NOW - 3600,
    )
    decision = decide(snap, config(), NOW)
    assert not decision.incident
    assert sorted(str(a.node) for a in decision.actions) == ["a1", "b1"]


def test_spares_are_left_out_of_the_partition_count() -> None:
    nodes = cluster(10)
    nodes["node10"] = node("node10", flags=DRAINED, reason="hyperpod:spare")
    nodes["node9"] = node("node9", flags=DRAINED, reason="hyperpod:spare")
    snap = Snapshot(
        nodes=nodes,
        health={n: healthy() for n in nodes},
        open_faults=[F2],
        history=[F2],
        started_at=NOW - 3600,
    )
    # 8 members; the floor of one node applies, spares do not count as "out"
    assert [a.kind for a in decide(snap, config(), NOW).actions] == [Kind.REBOOT]


def test_incident_event_names_partition_and_held_nodes() -> None:
    c = Case(
        "x", [], health={"node2": faulty(), "node3": faulty()}, open_faults=[F2, fault("node3")]
    )
    decision = decide(snap_of(c), config(), NOW)
    assert decision.incident
    [event] = decision.events
    assert event.kind == "incident"
    assert "partition main" in event.message and "node2, node3" in event.message


def test_urgent_fault_requeues_running_opted_in_job() -> None:
    c = Case(
        "x",
        [],
        health={"node2": faulty()},
        open_faults=[fault("node2", urgent=True)],
        jobs=[
            job(7, nodes=("node1", "node2")),
            job(8, nodes=("node2",), auto_resume=None),
            job(9, nodes=("node3",)),
        ],
    )
    got, _ = summary(c)
    assert matches(got, [("reboot", "node2", "hyperpod:reboot"), ("requeue", "7", "")])


def test_deferred_fault_lets_jobs_finish() -> None:
    c = Case("x", [], health={"node2": faulty()}, open_faults=[F2], jobs=[job(7, nodes=("node2",))])
    got, _ = summary(c)
    assert matches(got, [("reboot", "node2", "hyperpod:reboot")])


def test_incident_does_not_requeue_for_nodes_it_did_not_take_out() -> None:
    c = Case(
        "x",
        [],
        health={"node2": faulty(), "node3": faulty()},
        open_faults=[fault("node2", urgent=True), fault("node3", urgent=True)],
        jobs=[job(7, nodes=("node2",))],
    )
    got, incident = summary(c)
    assert got == [] and incident


def test_decide_is_pure_and_deterministic() -> None:
    c = Case(
        "x",
        [],
        health={"node2": faulty(), "node5": faulty()},
        open_faults=[F2, fault("node5", action="RESET")],
        cfg={"policy": {"max_unhealthy_fraction": 0.5}},
    )
    snap = snap_of(c)
    first = decide(snap, config(**c.cfg), NOW)
    second = decide(snap, config(**c.cfg), NOW)
    assert first == second


def test_node_dataclass_replace_helper_sanity() -> None:
    n = node("x", flags=DRAINED, reason="hyperpod:drain a b")
    assert replace(n, reason="").reason == "" and n.drained
