"""Shared causes and the per-partition blast radius, through ``decide`` (DESIGN §7)."""

from __future__ import annotations

from ctl_helpers import NOW, action_row, config, fault, faulty, healthy, node

from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.snapshot import Decision, Kind, Snapshot
from hyperpod_agent.controller.store.rows import FaultRow
from hyperpod_agent.slurm.models import Node

DRAINED = ("DRAIN",)


def part(prefix: str, n: int) -> dict[str, Node]:
    return {f"{prefix}{i}": node(f"{prefix}{i}", partitions=(prefix,)) for i in range(1, n + 1)}


def decide_on(
    nodes: dict[str, Node],
    faults: list[FaultRow],
    replaced: frozenset[str] = frozenset(),
    closed: tuple[FaultRow, ...] = (),
    **policy: object,
) -> Decision:
    health = {n: healthy() for n in nodes}
    health.update({f.node: faulty() for f in faults})
    snap = Snapshot(
        nodes=nodes,
        health=health,
        open_faults=faults,
        history=[*faults, *closed],
        burst_peers=closed,
        started_at=NOW - 3600,
        replaced=replaced,
    )
    return decide(snap, config(policy=policy) if policy else config(), NOW)


def taken_out(decision: Decision) -> list[str]:
    return sorted(str(a.node) for a in decision.actions if a.takes_out)


# -- shared cause -------------------------------------------------------------------
def test_one_code_on_many_nodes_at_once_is_a_shared_cause() -> None:
    # A hung shared filesystem: every node reports fs_hung within seconds.
    nodes = part("n", 40)
    faults = [
        fault(f"n{i}", component="/shared", code="fs_hung", first_seen=NOW - 60 + i)
        for i in range(1, 6)
    ]
    decision = decide_on(nodes, faults)
    assert taken_out(decision) == []
    assert decision.incident and decision.incident_reason.startswith("shared cause: fs_hung")
    [event] = [e for e in decision.events if e.kind == "shared_cause"]
    assert event.message.startswith("shared cause: fs_hung on 5 nodes within 30 s (n1, n2")


def test_the_same_code_far_apart_is_not_shared() -> None:
    nodes = part("n", 40)
    faults = [fault(f"n{i}", code="xid79", first_seen=NOW - 1000 + 100 * i) for i in range(1, 4)]
    assert taken_out(decide_on(nodes, faults, max_unhealthy_fraction=0.5)) == ["n1", "n2", "n3"]


def test_two_nodes_are_not_yet_a_shared_cause() -> None:
    nodes = part("n", 40)
    faults = [fault(f"n{i}", code="fs_hung", first_seen=NOW - 60) for i in (1, 2)]
    assert taken_out(decide_on(nodes, faults)) == ["n1", "n2"]


def test_a_young_deferred_fault_waits_for_the_window() -> None:
    nodes = part("n", 40)
    young = [fault("n1", code="link_down", first_seen=NOW - 5)]
    assert taken_out(decide_on(nodes, young)) == []
    assert taken_out(decide_on(nodes, young, shared_cause_window_s=0)) == ["n1"]


def test_an_urgent_fault_is_acted_on_at_once() -> None:
    nodes = part("n", 40)
    young = [fault("n1", code="xid79", urgent=True, first_seen=NOW - 1)]
    assert taken_out(decide_on(nodes, young)) == ["n1"]


def test_an_urgent_fault_a_second_node_shares_waits_for_the_window() -> None:
    nodes = part("n", 40)
    nodes["n1"] = node("n1", flags=DRAINED, reason="hyperpod:reboot gpu0 xid79 x")
    # n1 was taken out at once; n2 now shows the same code: it waits for the burst.
    faults = [fault(f"n{i}", code="xid79", urgent=True, first_seen=NOW - i) for i in (1, 2)]
    assert taken_out(decide_on(nodes, faults)) == []
    later = [fault(f"n{i}", code="xid79", urgent=True, first_seen=NOW - 40 - i) for i in (1, 2)]
    assert taken_out(decide_on(nodes, later)) == ["n2"]


def test_urgent_faults_on_many_nodes_at_once_are_shared_too() -> None:
    nodes = part("n", 40)
    faults = [fault(f"n{i}", code="xid79", urgent=True, first_seen=NOW - 1) for i in (1, 2, 3)]
    assert taken_out(decide_on(nodes, faults)) == []


def test_nodes_already_out_for_the_cause_count_toward_the_burst() -> None:
    nodes = part("n", 40)
    nodes["n1"] = node("n1", flags=DRAINED, reason="hyperpod:reboot /shared fs_hung x")
    faults = [fault(f"n{i}", code="fs_hung", first_seen=NOW - 40 + i) for i in (1, 2, 3)]
    assert taken_out(decide_on(nodes, faults)) == []


def test_a_shared_cause_outlives_the_fault_that_cleared_on_its_first_node() -> None:
    # The first node was rebooted at once (alone, urgent) and came back clean before the
    # burst was plain; the others still show the fault. The cause is still shared: the
    # cleared fault counts, and the others are not taken out once the window has passed.
    nodes = part("n", 40)
    first = fault("n1", code="xid79", urgent=True, first_seen=NOW - 50, closed_at=NOW - 20)
    rest = [fault(f"n{i}", code="xid79", urgent=True, first_seen=NOW - 49) for i in (2, 3)]
    decision = decide_on(nodes, rest, closed=(first,))
    assert taken_out(decision) == []
    [event] = [e for e in decision.events if e.kind == "shared_cause"]
    assert event.message.startswith("shared cause: xid79 on 3 nodes within 30 s (n1, n2, n3)")


def test_a_cleared_fault_far_from_the_open_ones_is_not_a_peer() -> None:
    nodes = part("n", 40)
    old = fault("n1", code="xid79", urgent=True, first_seen=NOW - 500, closed_at=NOW - 400)
    rest = [fault(f"n{i}", code="xid79", urgent=True, first_seen=NOW - 49) for i in (2, 3)]
    assert taken_out(decide_on(nodes, rest, closed=(old,), max_unhealthy_fraction=0.5)) == [
        "n2",
        "n3",
    ]


# -- blast radius per partition -------------------------------------------------------
def test_an_over_partition_does_not_stop_take_outs_elsewhere() -> None:
    nodes = part("a", 10) | part("b", 100)
    nodes["a1"] = node(
        "a1", flags=DRAINED, reason="hyperpod:replace gpu0 xid54 x", partitions=("a",)
    )
    decision = decide_on(nodes, [fault("a2"), fault("b7")])
    assert taken_out(decision) == ["b7"]
    assert decision.incident and "partition a:" in decision.incident_reason
    assert "partition b" not in decision.incident_reason


def test_a_held_node_whose_spare_came_in_no_longer_counts() -> None:
    nodes = part("a", 10)
    nodes["a1"] = node(
        "a1", flags=DRAINED, reason="hyperpod:replace gpu0 xid54 x", partitions=("a",)
    )
    assert taken_out(decide_on(nodes, [fault("a2")])) == []
    assert taken_out(decide_on(nodes, [fault("a2")], replaced=frozenset({"a1"}))) == ["a2"]


def test_replaced_only_excuses_our_replace_hold() -> None:
    # The node came back and a human drained it later: it counts again.
    nodes = part("a", 10)
    nodes["a1"] = node("a1", flags=DRAINED, reason="maintenance", partitions=("a",))
    assert taken_out(decide_on(nodes, [fault("a2")], replaced=frozenset({"a1"}))) == []


def test_humans_down_and_unresponsive_nodes_all_count() -> None:
    nodes = part("a", 20)  # limit 2
    nodes["a1"] = node("a1", flags=DRAINED, reason="maintenance", partitions=("a",))
    nodes["a2"] = node("a2", state="DOWN", flags=("NOT_RESPONDING",), partitions=("a",))
    decision = decide_on(nodes, [fault("a3")])
    assert taken_out(decision) == [] and decision.incident
    assert "2 node(s) unavailable and 1 more faulty of 20; limit 2" in decision.incident_reason


def test_taking_out_a_node_already_unavailable_costs_nothing() -> None:
    nodes = part("a", 10)
    nodes["a1"] = node("a1", flags=DRAINED, reason="maintenance", partitions=("a",))
    nodes["a2"] = node(
        "a2",
        state="DOWN",
        flags=("NOT_RESPONDING",),
        reason="Not responding",
        partitions=("a",),
    )
    decision = decide_on(nodes, [fault("a2", urgent=True)])
    assert [a.kind for a in decision.actions] == [Kind.REBOOT] and not decision.incident


def test_a_node_in_two_partitions_needs_room_in_both() -> None:
    nodes = part("a", 10) | part("b", 10)
    nodes["x"] = node("x", partitions=("a", "b"))
    nodes["b1"] = node("b1", flags=DRAINED, reason="maintenance", partitions=("b",))
    decision = decide_on(nodes, [fault("x")])
    assert taken_out(decision) == [] and "partition b:" in decision.incident_reason


def test_admin_requests_and_resumes_pass_in_an_incident() -> None:
    nodes = part("a", 10)
    nodes["a1"] = node("a1", flags=DRAINED, reason="maintenance", partitions=("a",))
    nodes["a3"] = node("a3", flags=("DRAIN", "FAIL"), reason="Action:Reboot", partitions=("a",))
    nodes["a4"] = node("a4", flags=DRAINED, reason="hyperpod:reset gpu0 xid46 x", partitions=("a",))
    decision = decide_on(nodes, [fault("a2")])
    kinds = sorted((a.kind.value, str(a.node)) for a in decision.actions)
    assert kinds == [("reboot", "a3"), ("resume", "a4")] and decision.incident


def test_in_flight_replacement_keeps_its_spare() -> None:
    nodes = part("a", 10)
    nodes["s1"] = node("s1", flags=DRAINED, reason="hyperpod:spare", partitions=("a",))
    snap = Snapshot(
        nodes=nodes,
        health={n: healthy() for n in nodes} | {"a2": faulty()},
        open_faults=[fault("a2", code="xid54", action="REPLACE")],
        history=[],
        in_flight=[action_row("replace", "a9", "intent", params={"spare": "s1"})],
        started_at=NOW - 3600,
    )
    [action] = decide(snap, config(), NOW).actions
    assert action.kind is Kind.REPLACE and "spare" not in action.params
    assert "no spare left" in str(action.params["no_spare"])


def test_a_shared_cause_spends_no_spare() -> None:
    # Replacements under auto-resume jobs: each has a spare, none is a capacity loss,
    # but the cause is shared: no node is swapped for it.
    from ctl_helpers import job

    nodes = part("n", 10)
    for i in (8, 9, 10):
        nodes[f"s{i}"] = node(f"s{i}", flags=DRAINED, reason="hyperpod:spare", partitions=("n",))
    faults = [fault(f"n{i}", code="xid79", urgent=True, first_seen=NOW - 1) for i in (1, 2, 3)]
    snap = Snapshot(
        nodes=nodes,
        jobs=[job(7, nodes=("n1", "n2", "n3"))],
        health={n: healthy() for n in nodes} | {f.node: faulty() for f in faults},
        open_faults=faults,
        history=faults,
        started_at=NOW - 3600,
    )
    decision = decide(snap, config(), NOW)
    assert [a for a in decision.actions if a.node is not None] == []


def _one_more_fault(**extra: object) -> Decision:
    """A 10-node partition (one node may be out) with a2 newly faulty."""
    nodes = part("a", 10)
    return decide(
        Snapshot(
            nodes=nodes,
            health={n: healthy() for n in nodes} | {"a2": faulty()},
            open_faults=[fault("a2", code="xid79", urgent=True)],
            history=[],
            started_at=NOW - 3600,
            **extra,  # type: ignore[arg-type]
        ),
        config(),
        NOW,
    )


def test_nodes_on_their_way_out_count_toward_the_blast_radius() -> None:
    # Slurm still shows a3 in service, but it is already leaving: a2 must wait.
    for extra in (
        {"in_flight": [action_row("drain", "a3", "intent")]},
        {"in_flight": [action_row("reboot", "a3", "applied")]},
        {"checking": frozenset({"a3"})},
        {"step_retries": {12: ("a3", "s9")}},
    ):
        d = _one_more_fault(**extra)
        assert d.incident, extra
        assert [a for a in d.actions if a.node == "a2"] == [], extra


def test_what_is_not_leaving_does_not_count() -> None:
    for extra in (
        {},
        {"in_flight": [action_row("resume", "a3", "intent")]},
        {"in_flight": [action_row("replace", "a3", "intent", params={"spare": "s1"})]},
    ):
        d = _one_more_fault(**extra)
        assert not d.incident, extra
        assert [a.node for a in d.actions] == ["a2"], extra


def test_a_disk_a_user_filled_never_holds_back_a_real_faults_remedy() -> None:
    # 10 nodes, one may be out: a3 is already drained for a full disk (drain-only).
    nodes = part("a", 10)
    nodes["a3"] = node("a3", flags=DRAINED, reason="hyperpod:drain scratch fs_full 0% free")
    d = decide(
        Snapshot(
            nodes=nodes,
            health={n: healthy() for n in nodes} | {"a2": faulty(), "a3": faulty()},
            open_faults=[
                fault("a2", code="xid79", urgent=True),
                fault("a3", component="scratch", code="fs_full", action="DRAIN"),
            ],
            history=[],
            started_at=NOW - 3600,
        ),
        config(),
        NOW,
    )
    assert not d.incident
    assert [a.node for a in d.actions] == ["a2"]


def test_drain_only_take_outs_are_limited_and_fit_after_real_ones() -> None:
    nodes = part("a", 10)
    full = [fault(f"a{i}", component="scratch", code="fs_full", action="DRAIN") for i in (4, 5)]
    d = decide(
        Snapshot(
            nodes=nodes,
            health={n: healthy() for n in nodes} | {n: faulty() for n in ("a2", "a4", "a5")},
            open_faults=[fault("a2", code="xid79", urgent=True), *full],
            history=[],
            started_at=NOW - 3600,
        ),
        config(policy={"shared_cause_min_nodes": 5}),
        NOW,
    )
    # the real fault takes the partition's one slot; the full disks wait (incident)
    assert [a.node for a in d.actions] == ["a2"]
    assert d.incident
