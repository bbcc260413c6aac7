"""The deep-check gates, pure: a rebooted node is checked before it resumes, a spare
is swapped in only while qualified, unqualified spares are checked ahead of need."""

from __future__ import annotations

from pathlib import Path

import pytest
from ctl_helpers import NOW, cluster, config, fault, healthy, node

from hyperpod_agent.controller.deepcheck.plan import gate, plan_spare_checks
from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.replacement import SparePool, spare_ready
from hyperpod_agent.controller.snapshot import Kind, Snapshot
from hyperpod_agent.controller.store.checks import NodeOutcome

SPARE = "hyperpod:spare"
REBOOTED = "hyperpod:reboot gpu3 xid79 XID 79 : reboot issued"
SUITE = Path("/etc/hyperpod/deep-checks.toml")


def gates(**extra: object) -> dict[str, object]:
    return {"suite": str(SUITE), "gate_reentry": True, "gate_spares": True, **extra}


def outcome(name: str, result: str = "OK", at: float = NOW - 10, ran: bool = True) -> NodeOutcome:
    return NodeOutcome(1, name, "spare", result, "" if result == "OK" else "nccl", "x", ran, at)


def snap(
    extra: dict[str, object] | None = None,
    outcomes: dict[str, NodeOutcome] | None = None,
    checking: frozenset[str] = frozenset(),
) -> Snapshot:
    nodes = cluster(4)
    nodes["node5"] = node("node5", flags=("DRAIN",), reason=SPARE, reason_time=NOW - 100)
    nodes["node6"] = node("node6", flags=("DRAIN",), reason=REBOOTED, reason_time=NOW - 100)
    for name, n in (extra or {}).items():
        nodes[name] = n  # type: ignore[assignment]
    return Snapshot(
        nodes=nodes,
        health={n: healthy() for n in nodes},
        started_at=NOW - 3600,
        check_outcomes=outcomes or {},
        checking=checking,
    )


@pytest.mark.parametrize(
    ("latest", "passed", "wait", "why"),
    [
        (None, False, False, "no deep check yet"),
        (outcome("node5"), True, False, ""),
        (outcome("node5", at=NOW - 200), False, False, "since it was last taken out"),
        (outcome("node5", at=NOW - 99.5), True, False, ""),  # reason time is whole seconds
        (outcome("node5", "FAIL"), False, True, "deep check nccl FAIL"),
        (outcome("node5", "UNKNOWN", ran=False), False, True, "could not run"),
        (outcome("node5", "UNKNOWN", at=NOW - 5, ran=False), False, True, "could not run"),
    ],
)
def test_gate_table(latest: NodeOutcome | None, passed: bool, wait: bool, why: str) -> None:
    deep = config(deep_checks=gates()).deep_checks
    got = gate(snap().nodes["node5"], latest, deep, NOW, frozenset())
    assert (got.passed, got.wait) == (passed, wait) and why in got.why


def test_a_run_that_could_not_start_is_tried_again_after_retry_s() -> None:
    deep = config(deep_checks=gates(retry_s=60)).deep_checks
    old = NodeOutcome(1, "node5", "spare", "UNKNOWN", "", "x", False, NOW - 61)
    n = node("node5", flags=("DRAIN",), reason=SPARE, reason_time=NOW - 100)
    assert not gate(n, old, deep, NOW, frozenset()).wait


def test_a_spare_is_ready_only_while_qualified() -> None:
    cfg = config(deep_checks=gates(spare_recheck_h=1))
    fresh = snap(outcomes={"node5": outcome("node5")})
    assert spare_ready(fresh.nodes["node5"], fresh, cfg.policy, NOW, cfg.deep_checks) is None
    never = snap()
    why = spare_ready(never.nodes["node5"], never, cfg.policy, NOW, cfg.deep_checks)
    assert why == "no deep check yet"
    stale = snap(outcomes={"node5": outcome("node5", at=NOW - 3700)})
    stale = Snapshot(
        nodes={**stale.nodes, "node5": node("node5", flags=("DRAIN",), reason=SPARE)},
        health=stale.health,
        check_outcomes=stale.check_outcomes,
    )
    why = spare_ready(stale.nodes["node5"], stale, cfg.policy, NOW, cfg.deep_checks)
    assert why is not None and "h old" in why
    assert SparePool(never, cfg.policy, NOW, cfg.deep_checks).take(never.nodes["node1"]) is None
    pool = SparePool(fresh, cfg.policy, NOW, cfg.deep_checks)
    assert pool.take(fresh.nodes["node1"]) == "node5"


def test_gates_off_change_nothing() -> None:
    cfg = config()
    s = snap()
    assert spare_ready(s.nodes["node5"], s, cfg.policy, NOW, cfg.deep_checks) is None
    kinds = [a.kind for a in decide(s, cfg, NOW).actions]
    assert Kind.CHECK not in kinds and Kind.RESUME in kinds  # node6 resumes as today


def test_a_rebooted_node_is_checked_before_it_resumes() -> None:
    cfg = config(deep_checks=gates(gate_spares=False))
    [check] = [a for a in decide(snap(), cfg, NOW).actions if a.node == "node6"]
    assert check.kind is Kind.CHECK and check.params["purpose"] == "reentry"
    assert check.params["prior"] == {"node6": REBOOTED}
    passed = snap(outcomes={"node6": outcome("node6")})
    [resume] = [a for a in decide(passed, cfg, NOW).actions if a.node == "node6"]
    assert resume.kind is Kind.RESUME
    under_way = snap(checking=frozenset({"node6"}))
    assert not [a for a in decide(under_way, cfg, NOW).actions if a.node == "node6"]


def test_a_drain_is_not_gated_unless_configured() -> None:
    drained = node("node6", flags=("DRAIN",), reason="hyperpod:drain disk scratch full")
    s = snap({"node6": drained})
    [a] = [a for a in decide(s, config(deep_checks=gates()), NOW).actions if a.node == "node6"]
    assert a.kind is Kind.RESUME
    cfg = config(deep_checks=gates(gate_after=["drain"]))
    [a] = [a for a in decide(s, cfg, NOW).actions if a.node == "node6"]
    assert a.kind is Kind.CHECK


def test_spares_are_checked_ahead_of_need_in_runs_per_partition() -> None:
    cfg = config(deep_checks=gates(max_nodes_per_run=2))
    spares = {
        f"node{i}": node(f"node{i}", flags=("DRAIN",), reason=SPARE, partitions=(part,))
        for i, part in ((7, "a"), (8, "a"), (9, "a"), (10, "b"))
    }
    s = snap(spares, outcomes={"node5": outcome("node5")})
    ready = {n for n in s.nodes if s.nodes[n].reason == SPARE}
    planned = plan_spare_checks(s, cfg.deep_checks, NOW, ready, busy=set())
    groups = sorted(tuple(a.params["nodes"]) for a in planned)
    assert groups == [("node10",), ("node7", "node8"), ("node9",)]  # node5 is qualified
    assert all(a.params["purpose"] == "spare" for a in planned)
    assert plan_spare_checks(s, cfg.deep_checks, NOW, ready, busy={"node7", "node8"}) != planned


# --- on by default with a suite; hyperpod:check; limits ---------------------------------

FIRST_USE = "hyperpod:check provision new deep check before first use"
SUITE_ONLY = {"suite": str(SUITE)}  # the gate keys left out


def test_with_a_suite_and_no_gate_keys_a_rebooted_node_is_checked_first() -> None:
    [a] = [
        a for a in decide(snap(), config(deep_checks=SUITE_ONLY), NOW).actions if a.node == "node6"
    ]
    assert a.kind is Kind.CHECK and a.params["purpose"] == "reentry"


def test_with_a_suite_and_no_gate_keys_a_spare_must_be_qualified() -> None:
    cfg = config(deep_checks=SUITE_ONLY)
    s = snap()
    assert spare_ready(s.nodes["node5"], s, cfg.policy, NOW, cfg.deep_checks) == "no deep check yet"
    spare_checks = [a for a in decide(s, cfg, NOW).actions if a.params.get("purpose") == "spare"]
    assert [a.params["nodes"] for a in spare_checks] == [["node5"]]


def test_a_gate_set_false_is_off_though_a_suite_is_named() -> None:
    cfg = config(deep_checks={**SUITE_ONLY, "gate_reentry": False, "gate_spares": False})
    s = snap()
    assert spare_ready(s.nodes["node5"], s, cfg.policy, NOW, cfg.deep_checks) is None
    actions = decide(s, cfg, NOW).actions
    assert Kind.CHECK not in [a.kind for a in actions]
    assert [a.kind for a in actions if a.node == "node6"] == [Kind.RESUME]


@pytest.mark.parametrize(
    "reason",
    [
        FIRST_USE,
        "hyperpod:check replace back replaced for gpu0 xid54",
        "hyperpod:check admin resume after the RMA",
    ],
)
def test_a_node_under_check_is_checked_then_resumed(reason: str) -> None:
    waiting = node("node6", flags=("DRAIN",), reason=reason, reason_time=NOW - 100)
    cfg = config(deep_checks=SUITE_ONLY)
    [check] = [a for a in decide(snap({"node6": waiting}), cfg, NOW).actions if a.node == "node6"]
    assert check.kind is Kind.CHECK and check.params["purpose"] == "reentry"
    assert check.params["prior"] == {"node6": reason} and "before it takes work" in check.cause
    passed = snap({"node6": waiting}, outcomes={"node6": outcome("node6")})
    [resume] = [a for a in decide(passed, cfg, NOW).actions if a.node == "node6"]
    assert resume.kind is Kind.RESUME


def test_check_is_gated_whatever_gate_after_says() -> None:
    waiting = node("node6", flags=("DRAIN",), reason=FIRST_USE, reason_time=NOW - 100)
    cfg = config(deep_checks={**SUITE_ONLY, "gate_after": ["drain"]})
    [a] = [a for a in decide(snap({"node6": waiting}), cfg, NOW).actions if a.node == "node6"]
    assert a.kind is Kind.CHECK


def test_an_old_pass_does_not_count_for_a_node_under_check() -> None:
    """A run before the node was handed to the gate (e.g. before its replacement) says
    nothing about the machine that came back."""
    waiting = node("node6", flags=("DRAIN",), reason=FIRST_USE, reason_time=NOW - 100)
    old = snap({"node6": waiting}, outcomes={"node6": outcome("node6", at=NOW - 500)})
    [a] = [a for a in decide(old, config(deep_checks=SUITE_ONLY), NOW).actions if a.node == "node6"]
    assert a.kind is Kind.CHECK


def test_without_gates_a_node_under_check_resumes_once_healthy() -> None:
    waiting = node("node6", flags=("DRAIN",), reason=FIRST_USE, reason_time=NOW - 100)
    s = snap({"node6": waiting})
    for cfg in (config(), config(deep_checks={**SUITE_ONLY, "gate_reentry": False})):
        [a] = [a for a in decide(s, cfg, NOW).actions if a.node == "node6"]
        assert a.kind is Kind.RESUME
    silent = Snapshot(nodes=s.nodes, health={}, started_at=NOW - 3600)
    assert not [a for a in decide(silent, config(), NOW).actions if a.node == "node6"]


def test_a_node_never_seen_before_is_not_gated() -> None:
    """Installing the controller on a live cluster: nodes in service, never checked,
    some without any report yet. Nothing is drained or checked for it."""
    s = snap()
    live = Snapshot(
        nodes={n: s.nodes[n] for n in ("node1", "node2", "node3", "node4")},
        health={"node1": healthy()},
        started_at=NOW,
    )
    assert decide(live, config(deep_checks=SUITE_ONLY), NOW).actions == []


def test_a_humans_drain_is_never_checked_or_resumed() -> None:
    theirs = node("node6", flags=("DRAIN",), reason="check before first use -- alice")
    s = snap({"node6": theirs})
    assert not [
        a for a in decide(s, config(deep_checks=SUITE_ONLY), NOW).actions if a.node == "node6"
    ]


def test_a_drain_only_fault_leaves_a_node_waiting_for_its_check() -> None:
    waiting = node("node6", flags=("DRAIN",), reason=FIRST_USE, reason_time=NOW - 100)
    s = snap({"node6": waiting})
    full = fault("node6", "disk", "fs_full", "DRAIN")
    s = Snapshot(nodes=s.nodes, health=s.health, started_at=s.started_at, open_faults=[full])
    assert not [
        a for a in decide(s, config(deep_checks=SUITE_ONLY), NOW).actions if a.node == "node6"
    ]
    reset = fault("node6", "gpu0", "xid46", "RESET")
    s = Snapshot(nodes=s.nodes, health=s.health, started_at=s.started_at, open_faults=[reset])
    [a] = [a for a in decide(s, config(deep_checks=SUITE_ONLY), NOW).actions if a.node == "node6"]
    assert a.kind is Kind.DRAIN and a.reason.startswith("hyperpod:reset gpu0 xid46")


def test_at_most_max_nodes_per_run_are_under_re_entry_check_at_once() -> None:
    new = {
        f"node{i}": node(f"node{i}", flags=("DRAIN",), reason=FIRST_USE, reason_time=NOW - 100)
        for i in (7, 8, 9)
    }
    cfg = config(deep_checks={**SUITE_ONLY, "gate_spares": False, "max_nodes_per_run": 2})
    checks = [a for a in decide(snap(new), cfg, NOW).actions if a.kind is Kind.CHECK]
    assert len(checks) == 2  # node6 (rebooted) and node7..9 compete for two places
    busy = snap(new, checking=frozenset({"node6"}))
    checks = [a for a in decide(busy, cfg, NOW).actions if a.kind is Kind.CHECK]
    assert [a.node for a in checks] == ["node7"]
    full = snap(new, checking=frozenset({"node6", "node1"}))
    assert not [a for a in decide(full, cfg, NOW).actions if a.kind is Kind.CHECK]
