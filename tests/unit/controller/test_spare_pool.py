"""Which spares may be swapped in: only those their agent vouches for, now."""

from __future__ import annotations

import pytest
from ctl_helpers import NOW, action_row, cluster, config, fault, faulty, healthy, node

from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.replacement import SparePool, spare_ready
from hyperpod_agent.controller.snapshot import Kind, NodeHealth, Snapshot
from hyperpod_agent.health import Verdict

DRAINED = ("DRAIN",)
SPARE = "hyperpod:spare"


def snap_with_spare(health: NodeHealth | None, **spare: object) -> Snapshot:
    nodes = cluster(4)
    fields: dict[str, object] = {"flags": DRAINED, **spare}
    nodes["node5"] = node("node5", reason=SPARE, **fields)  # type: ignore[arg-type]
    table = {n: healthy() for n in nodes if n != "node5"}
    if health is not None:
        table["node5"] = health
    return Snapshot(nodes=nodes, health=table, started_at=NOW - 3600)


@pytest.mark.parametrize(
    ("health", "spare", "why"),
    [
        (None, {}, "no report from its agent"),
        (faulty(), {}, "its agent says faulty"),
        (NodeHealth(Verdict.DEGRADED, NOW - 1, NOW - 1), {}, "its agent says degraded"),
        (healthy(last_seen=NOW - 600), {}, "no word from its agent for > 90 s"),
        (healthy(generated_at=NOW - 100), {"boot_time": NOW - 50}, "not reported since it booted"),
        (healthy(), {"flags": ("DRAIN", "NOT_RESPONDING")}, "not responding"),
    ],
)
def test_a_spare_nobody_vouches_for_is_not_ready(
    health: NodeHealth | None, spare: dict[str, object], why: str
) -> None:
    snap = snap_with_spare(health, **spare)
    got = spare_ready(snap.nodes["node5"], snap, config().policy, NOW)
    assert got is not None and why in got
    assert SparePool(snap, config().policy, NOW).take(snap.nodes["node1"]) is None


def test_a_healthy_recent_spare_is_ready() -> None:
    snap = snap_with_spare(healthy())
    assert spare_ready(snap.nodes["node5"], snap, config().policy, NOW) is None
    assert SparePool(snap, config().policy, NOW).take(snap.nodes["node1"]) == "node5"


def test_a_spare_with_an_open_fault_is_not_ready() -> None:
    base = snap_with_spare(healthy())
    snap = Snapshot(
        nodes=base.nodes,
        health=base.health,
        open_faults=[fault("node5", code="xid79", urgent=True)],
        started_at=base.started_at,
    )
    assert spare_ready(snap.nodes["node5"], snap, config().policy, NOW) == "open faults xid79"


def test_a_faulty_spare_is_not_swapped_in_and_the_next_good_one_is() -> None:
    # The spare node5 reported XID 79; then XID 79 hits node2 under an auto-resume job.
    from ctl_helpers import job

    nodes = cluster(4)
    nodes["node5"] = node("node5", flags=DRAINED, reason=SPARE)
    nodes["node6"] = node("node6", flags=DRAINED, reason=SPARE)
    hit = fault("node2", code="xid79", urgent=True)
    spare_fault = fault("node5", code="xid79", urgent=True)
    snap = Snapshot(
        nodes=nodes,
        jobs=[job(12, nodes=("node1", "node2"))],
        health={n: healthy() for n in nodes} | {"node2": faulty(), "node5": faulty()},
        open_faults=[hit, spare_fault],
        history=[hit, spare_fault],
        started_at=NOW - 3600,
    )
    actions = decide(snap, config(), NOW).actions
    [replace] = [a for a in actions if a.kind is Kind.REPLACE]
    assert replace.node == "node2" and replace.params["spare"] == "node6"
    assert not any(a.node == "node5" for a in actions)  # a spare is never acted on


def test_no_good_spare_says_why_and_the_node_is_rebooted_instead() -> None:
    from ctl_helpers import job

    nodes = cluster(4)
    nodes["node5"] = node("node5", flags=DRAINED, reason=SPARE)
    hit = fault("node2", code="xid79", urgent=True)
    snap = Snapshot(
        nodes=nodes,
        jobs=[job(12, nodes=("node1", "node2"))],
        health={n: healthy() for n in nodes} | {"node2": faulty(), "node5": faulty()},
        open_faults=[hit],
        history=[hit],
        started_at=NOW - 3600,
    )
    kinds = [(a.kind, a.node or a.job_id) for a in decide(snap, config(), NOW).actions]
    assert kinds == [(Kind.REBOOT, "node2"), (Kind.REQUEUE, 12)]


def test_a_spare_promised_to_a_replacement_under_way_is_not_free() -> None:
    base = snap_with_spare(healthy())
    snap = Snapshot(
        nodes=base.nodes,
        health=base.health,
        in_flight=[action_row("replace", "node3", "intent", params={"spare": "node5"})],
        started_at=base.started_at,
    )
    pool = SparePool(snap, config().policy, NOW)
    assert pool.take(snap.nodes["node1"]) is None
    assert pool.why_none(snap.nodes["node1"]) == "no spare left in partitions main"
