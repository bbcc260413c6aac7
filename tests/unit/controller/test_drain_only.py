"""DRAIN: the remedy that takes a node out and never reboots or replaces it.

What a full disk asks for (users fill what they can write; a reboot empties no disk
but a tmpfs): the node is drained under our ``drain`` reason, however often the fault
repeats it is never escalated, it never counts toward a lemon, it counts toward the
blast radius like any take-out, and the node is resumed once it reports healthy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from ctl_helpers import NOW, action_row, cluster, config, fault, faulty, healthy, job, node

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.report_faults import faults_from_report
from hyperpod_agent.controller.safety import counted
from hyperpod_agent.controller.snapshot import Decision, Kind, NodeHealth, PlannedAction, Snapshot
from hyperpod_agent.controller.store.rows import ActionRow, FaultRow
from hyperpod_agent.health import (
    ACTION_ORDER,
    Action,
    FaultRef,
    Finding,
    NodeReport,
    ProbeResult,
    Status,
    Verdict,
    strongest,
)
from hyperpod_agent.reasons import Verb, parse_reason
from hyperpod_agent.slurm.models import Job, Node

DRAINED = ("DRAIN",)
FULL_REASON = "hyperpod:drain scratch fs_full 0.5% space free"


def full(name: str = "node2", first_seen: float = NOW - 60, **kw: object) -> FaultRow:
    """A full scratch as the store keeps it: the disk probe's default action."""
    row = fault(name, "scratch", "fs_full", "DRAIN", first_seen=first_seen, **kw)  # type: ignore[arg-type]
    return replace(row, message="0.5% space free")


def plan(
    open_faults: Sequence[FaultRow] = (),
    history: Sequence[FaultRow] = (),
    changes: dict[str, Node] | None = None,
    health: dict[str, NodeHealth] | None = None,
    done: Sequence[ActionRow] = (),
    jobs: Sequence[Job] = (),
    cfg: ControllerConfig | None = None,
    size: int = 10,
) -> Decision:
    nodes = cluster(size)
    nodes.update(changes or {})
    states = {n: healthy() for n in nodes}
    states.update({f.node: faulty() for f in open_faults})
    states.update(health or {})
    snap = Snapshot(
        nodes=nodes,
        jobs=jobs,
        health=states,
        open_faults=open_faults,
        history=[*history, *(f for f in open_faults if f not in history)],
        done=done,
        started_at=NOW - 3600,
    )
    return decide(snap, cfg or config(), NOW)


def on(d: Decision, name: str = "node2") -> list[PlannedAction]:
    return [a for a in d.actions if a.node == name]


# --- the vocabulary -----------------------------------------------------------------------


def test_drain_sits_between_monitor_and_reset() -> None:
    assert ACTION_ORDER == [
        Action.NONE, Action.MONITOR, Action.DRAIN, Action.RESET, Action.REBOOT, Action.REPLACE
    ]  # fmt: skip
    assert strongest([Action.MONITOR, Action.DRAIN]) is Action.DRAIN
    assert strongest([Action.DRAIN, Action.RESET]) is Action.RESET


def test_drain_never_escalates() -> None:
    assert Action.DRAIN.escalate() is Action.DRAIN
    assert Action.RESET.escalate() is Action.REBOOT  # the ladder itself is unchanged


@pytest.mark.parametrize(
    ("action", "takes_out"),
    [(Action.NONE, False), (Action.MONITOR, False), (Action.DRAIN, True),
     (Action.RESET, True), (Action.REBOOT, True), (Action.REPLACE, True)],
)  # fmt: skip
def test_takes_out_says_which_actions_leave_service(action: Action, takes_out: bool) -> None:
    assert action.takes_out is takes_out


def test_a_fault_override_may_ask_for_a_drain() -> None:
    cfg = config(policy={"fault_overrides": {"script_fail": {"action": "DRAIN"}}})
    assert cfg.policy.fault_overrides["script_fail"].action is Action.DRAIN


# --- from a report to a fault --------------------------------------------------------------


def test_a_confirmed_drain_finding_is_a_drain_fault() -> None:
    finding = Finding(component="scratch", code="fs_full", status=Status.FAIL,
                      action=Action.DRAIN, message="0.5% space free")  # fmt: skip
    report = NodeReport(
        node="node2", agent_id="a", seq=1, generated_at="2027-01-15T08:00:00Z",  # type: ignore[arg-type]
        verdict=Verdict.FAULTY, action=Action.DRAIN, results=[ProbeResult(
            probe="disk", status=Status.FAIL, findings=[finding], at="2027-01-15T08:00:00Z"  # type: ignore[arg-type]
        )], confirmed=[FaultRef(probe="disk", component="scratch", code="fs_full")],
    )  # fmt: skip
    [got] = faults_from_report(report, config().policy).faults
    assert (got.code, got.action, got.urgent) == ("fs_full", "DRAIN", False)


# --- the policy: drain, with our reason -------------------------------------------------------


def test_a_drain_fault_drains_the_node_with_our_drain_reason() -> None:
    [a] = on(plan([full()]))
    assert (a.kind, a.reason, a.takes_out, a.urgent) == (Kind.DRAIN, FULL_REASON, True, False)
    ours = parse_reason(a.reason)
    assert ours is not None and (ours.verb, ours.component, ours.code) == (
        Verb.DRAIN, "scratch", "fs_full"
    )  # fmt: skip
    assert a.params["fault_code"] == "fs_full"
    assert counted(a)  # a take-out the blast radius weighs


def test_a_drain_fault_waits_out_the_shared_cause_window_like_any_non_urgent_take_out() -> None:
    assert on(plan([full(first_seen=NOW - 5)])) == []


def test_a_monitor_fault_beside_it_changes_nothing() -> None:
    xid13 = fault("node2", code="xid13", action="MONITOR")
    assert [a.kind for a in on(plan([full(), xid13]))] == [Kind.DRAIN]


def test_a_stronger_fault_beside_it_wins() -> None:
    xid79 = fault("node2", component="gpu3")
    [a] = on(plan([full(), xid79]))
    assert a.kind is Kind.REBOOT and a.reason.startswith("hyperpod:reboot gpu3 xid79")


# --- never escalated ----------------------------------------------------------------------


def test_a_drain_is_never_escalated_however_often_it_repeats() -> None:
    history = [full(first_seen=NOW - 300 * i, closed_at=NOW - 300 * i + 60) for i in range(1, 12)]
    # even the remedies we completed on the node since the fault appeared do not count
    done = [action_row("reboot", "node2", updated_at=NOW - 30),
            action_row("replace", "node2", updated_at=NOW - 20)]  # fmt: skip
    [a] = on(plan([full(first_seen=NOW - 3000)], history, done=done))
    assert (a.kind, a.reason) == (Kind.DRAIN, FULL_REASON)


def test_a_node_out_for_a_drain_stays_out_while_the_fault_repeats() -> None:
    out = {"node2": node("node2", flags=DRAINED, reason=FULL_REASON, reason_time=NOW - 86400)}
    history = [full(first_seen=NOW - 300 * i, closed_at=NOW - 300 * i + 60) for i in range(1, 12)]
    # idle far past reset_timeout_s: a drain has no timer that turns into a reboot
    assert on(plan([full(first_seen=NOW - 3600)], history, changes=out)) == []


def test_a_drain_does_not_count_as_a_repeat_of_another_remedy() -> None:
    history = [full(first_seen=NOW - 300 * i, closed_at=NOW - 300 * i + 60) for i in range(1, 4)]
    link = fault("node2", component="scratch", code="fs_readonly", action="REBOOT")
    [a] = on(plan([link], history))
    assert a.kind is Kind.REBOOT  # not escalated to a replacement by the fills


def test_a_reset_drained_node_left_with_only_a_drain_fault_stays_out_never_rebooted() -> None:
    """The GPU was reset (its fault is gone) but the disk is full: the node stays out,
    and the reset's timer no longer runs toward a reboot. Its reason is left as it is,
    so a deep-check gate after a reset (``gate_after``) still applies before it resumes."""
    out = {
        "node2": node(
            "node2", flags=DRAINED, reason="hyperpod:reset gpu0 xid46 x", reason_time=NOW - 7200
        )
    }
    assert on(plan([full()], changes=out)) == []
    assert [a.kind for a in on(plan(changes=out))] == [Kind.RESUME]  # once emptied


def test_a_reset_still_wanted_reboots_after_the_timeout_as_before() -> None:
    out = {
        "node2": node(
            "node2", flags=DRAINED, reason="hyperpod:reset gpu0 xid46 x", reason_time=NOW - 7200
        )
    }
    xid46 = fault("node2", code="xid46", action="RESET")
    [a] = on(plan([full(), xid46], changes=out))
    assert a.kind is Kind.REBOOT and a.reason.startswith("hyperpod:reboot gpu0 xid46")


def test_a_stronger_fault_on_a_node_out_for_a_drain_escalates_as_usual() -> None:
    out = {"node2": node("node2", flags=DRAINED, reason=FULL_REASON)}
    [a] = on(plan([full(), fault("node2", component="gpu3")], changes=out))
    assert (a.kind, a.takes_out) == (Kind.REBOOT, False)


def test_an_urgent_drain_under_an_auto_resume_job_is_not_replaced_by_a_spare() -> None:
    spare = {"node5": node("node5", flags=DRAINED, reason="hyperpod:spare")}
    urgent = full(urgent=True)
    d = plan([urgent], changes=spare, jobs=[job(12, nodes=("node1", "node2"))], size=4,
             cfg=config(policy={"max_unhealthy_fraction": 0.5}))  # fmt: skip
    [a] = on(d)
    assert (a.kind, a.reason, a.urgent) == (Kind.DRAIN, FULL_REASON, True)
    assert not any(x.kind is Kind.REPLACE for x in d.actions)


# --- the lemon -----------------------------------------------------------------------------


def test_drain_faults_never_count_toward_the_lemon_score() -> None:
    # a site script asking for a drain, ten times this week: still not a lemon
    drains = [fault("node2", component="site", code="script_fail", action="DRAIN",
                    first_seen=NOW - 3600 * i, closed_at=NOW - 3600 * i + 60)
              for i in range(1, 11)]  # fmt: skip
    xid79 = fault("node2", component="gpu3")
    assert [a.kind for a in on(plan([xid79], drains))] == [Kind.REBOOT]


def test_a_probes_configuration_findings_never_count_toward_the_lemon_score() -> None:
    # a slurmd NodeName mismatch reported after each of ten agent restarts this week
    config = [fault("node2", component="slurmd", code="config_node_name", action="MONITOR",
                    first_seen=NOW - 3600 * i, closed_at=NOW - 3600 * i + 60)
              for i in range(1, 11)]  # fmt: skip
    xid79 = fault("node2", component="gpu3")
    assert [a.kind for a in on(plan([xid79], config))] == [Kind.REBOOT]


def test_a_drain_fault_alone_never_holds_a_lemon() -> None:
    """A node past the lemon threshold for other faults is drained for a full disk, not
    held for repair: holding it would make the fill a repair case."""
    old = [fault("node2", component="gpu3", code="xid79", first_seen=NOW - 86400 * d,
                 closed_at=NOW - 86400 * d + 600) for d in (1, 2, 3, 4, 5)]  # fmt: skip
    [a] = on(plan([full()], old))
    assert (a.kind, a.reason) == (Kind.DRAIN, FULL_REASON)
    # what does make a lemon still does
    [held] = on(plan([fault("node2", component="gpu3")], old))
    assert held.kind is Kind.HOLD and "lemon" in held.reason


# --- back in service -------------------------------------------------------------------------


def test_a_node_out_for_a_drain_is_resumed_once_healthy() -> None:
    out = {"node2": node("node2", flags=DRAINED, reason=FULL_REASON)}
    [a] = on(plan(changes=out))
    assert a.kind is Kind.RESUME and a.cause == "healthy again after drain scratch fs_full"


@pytest.mark.parametrize(
    "health",
    [faulty(), healthy(last_seen=NOW - 3600)],
    ids=["still faulty", "agent silent"],
)
def test_a_node_out_for_a_drain_is_not_resumed_before(health: NodeHealth) -> None:
    out = {"node2": node("node2", flags=DRAINED, reason=FULL_REASON)}
    assert on(plan(changes=out, health={"node2": health})) == []


def test_a_node_the_agent_drained_itself_for_a_full_disk_is_resumed_once_healthy() -> None:
    """The agent's self-drain writes the same verb (agent/selfdrain.py)."""
    out = {"node2": node("node2", flags=DRAINED, reason="hyperpod:drain scratch fs_full x")}
    assert [a.kind for a in on(plan(changes=out))] == [Kind.RESUME]


# --- the blast radius --------------------------------------------------------------------------


def test_drains_count_toward_the_blast_radius() -> None:
    # ten nodes at the default 10%: one may be out
    d = plan([full("node2"), full("node3")])
    assert d.incident and not [a for a in d.actions if a.kind is Kind.DRAIN]
    assert "partition main" in d.incident_reason


def test_a_drain_is_held_back_when_another_node_is_already_out() -> None:
    human = {"node7": node("node7", flags=DRAINED, reason="maintenance")}
    d = plan([full("node2")], changes=human)
    assert d.incident and on(d) == []


def test_one_drain_within_the_limit_goes() -> None:
    d = plan([full("node2")])
    assert not d.incident and [a.kind for a in on(d)] == [Kind.DRAIN]
