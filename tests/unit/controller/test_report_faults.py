"""From an agent's report to tracked faults: only what the verdict confirmed is
actionable; pending and UNKNOWN keep what is open (DESIGN §2, §7)."""

from __future__ import annotations

from datetime import UTC, datetime

from ctl_helpers import NOW, config

from hyperpod_agent.controller.report_faults import faults_from_report
from hyperpod_agent.health import (
    Action,
    FaultRef,
    Finding,
    NodeReport,
    ProbeResult,
    Status,
    Verdict,
)

AT = datetime.fromtimestamp(NOW, UTC)
XID79 = Finding(
    component="gpu0",
    code="xid79",
    status=Status.FAIL,
    action=Action.REBOOT,
    urgent=True,
    message="fell off",
)
SLURMD = Finding(
    component="slurmd",
    code="slurmd_unresponsive",
    status=Status.FAIL,
    action=Action.REBOOT,
    message="no answer",
)


def report(
    results: list[ProbeResult],
    confirmed: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
    verdict: Verdict = Verdict.FAULTY,
    action: Action = Action.NONE,
) -> NodeReport:
    return NodeReport(
        node="node2",
        agent_id="a",
        seq=1,
        generated_at=AT,
        verdict=verdict,
        action=action,
        results=results,
        confirmed=[FaultRef(probe=p, component=c, code=k) for p, c, k in confirmed],
    )


def result(probe: str, findings: list[Finding], status: Status = Status.FAIL) -> ProbeResult:
    return ProbeResult(probe=probe, status=status, findings=findings, at=AT)


def test_confirmed_fail_and_warn_findings() -> None:
    got = faults_from_report(
        report(
            [
                result(
                    "gpu",
                    [
                        XID79,
                        Finding(component="gpu1", code="xid13", status=Status.WARN),
                        Finding(
                            component="gpu2",
                            code="probe_crash",
                            status=Status.UNKNOWN,
                            action=Action.REPLACE,
                        ),
                        Finding(component="gpu3", code="ok", status=Status.OK),
                    ],
                )
            ],
            confirmed=[("gpu", "gpu0", "xid79")],
        ),
        config().policy,
    )
    faults = {(f.component, f.code): f for f in got.faults}
    assert set(faults) == {("gpu0", "xid79"), ("gpu1", "xid13")}
    assert faults[("gpu0", "xid79")].action == "REBOOT" and faults[("gpu0", "xid79")].urgent
    assert faults[("gpu0", "xid79")].probe == "gpu"
    assert faults[("gpu1", "xid13")].action == "MONITOR"


def test_a_pending_finding_is_not_a_fault_but_keeps_an_open_one() -> None:
    # A DEGRADED report with one finding the agent has not confirmed (1 of 2 strikes).
    got = faults_from_report(
        report([result("slurmd", [SLURMD])], verdict=Verdict.DEGRADED), config().policy
    )
    assert got.faults == []
    assert got.keep == {("slurmd", "slurmd_unresponsive")}


def test_a_finding_held_in_start_up_grace_is_not_acted_on() -> None:
    got = faults_from_report(
        report([result("gpu", [XID79])], verdict=Verdict.DEGRADED), config().policy
    )
    assert got.faults == [] and got.keep == {("gpu0", "xid79")}


def test_a_confirmation_from_another_probe_does_not_count() -> None:
    got = faults_from_report(
        report([result("gpu", [XID79])], confirmed=[("nic", "gpu0", "xid79")]),
        config().policy,
    )
    # The FAULTY verdict still yields a fault (never ignored), but not the finding.
    assert [(f.component, f.code) for f in got.faults] == [("node", "faulty")]


def test_warnings_never_ask_for_a_take_out_even_with_an_override() -> None:
    warn = Finding(component="gpu0", code="thermal", status=Status.WARN, action=Action.MONITOR)
    cfg = config(policy={"fault_overrides": {"thermal": {"action": "REBOOT", "urgent": True}}})
    got = faults_from_report(report([result("gpu", [warn])], verdict=Verdict.DEGRADED), cfg.policy)
    [f] = got.faults
    assert (f.action, f.urgent) == ("MONITOR", False)


def test_overrides_apply_to_confirmed_faults() -> None:
    xid63 = Finding(component="gpu0", code="xid63", status=Status.FAIL, action=Action.MONITOR)
    cfg = config(policy={"fault_overrides": {"xid63": {"action": "REBOOT", "urgent": True}}})
    got = faults_from_report(
        report([result("gpu", [xid63])], confirmed=[("gpu", "gpu0", "xid63")]), cfg.policy
    )
    [f] = got.faults
    assert (f.action, f.urgent) == ("REBOOT", True)


def test_a_failed_probe_without_findings_names_itself() -> None:
    got = faults_from_report(
        report([result("script", [])], confirmed=[("script", "script", "fail")]),
        config().policy,
    )
    [f] = got.faults
    assert (f.component, f.code, f.probe) == ("script", "fail", "script")


def test_faulty_verdict_naming_nothing_is_still_a_fault() -> None:
    got = faults_from_report(report([], action=Action.REPLACE), config().policy)
    [f] = got.faults
    assert (f.component, f.code, f.action) == ("node", "faulty", "REPLACE")


def test_unknown_probe_keeps_its_faults() -> None:
    got = faults_from_report(
        report([result("gpu", [], status=Status.UNKNOWN)], verdict=Verdict.DEGRADED),
        config().policy,
    )
    assert got.faults == [] and got.keep_probes == {"gpu"}


def test_unknown_findings_are_not_faults() -> None:
    nvml = Finding(component="gpu0", code="nvml", status=Status.UNKNOWN)
    got = faults_from_report(
        report([result("gpu", [nvml], status=Status.UNKNOWN)], verdict=Verdict.DEGRADED),
        config().policy,
    )
    assert got.faults == []
