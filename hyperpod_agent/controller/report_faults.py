"""From an agent's report to the faults the controller tracks. Pure.

Only what the agent's verdict confirmed (``NodeReport.confirmed``: past its flap
damping and start-up grace) may ask for a take-out. WARN findings are recorded as
MONITOR (history, lemon score); FAIL findings the verdict has not confirmed yet are not
recorded, but keep an already open fault open, so a restarted agent counting strikes
again does not close a fault and reopen it as a repeat. A probe that could not look
(UNKNOWN) neither confirms nor clears its faults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hyperpod_agent.controller.config import PolicyConfig
from hyperpod_agent.controller.store.rows import FaultIn
from hyperpod_agent.health import Action, Finding, NodeReport, ProbeResult, Status, Verdict


@dataclass(frozen=True)
class ReportFaults:
    """What one report says about the node's faults."""

    faults: list[FaultIn]  # open these, or refresh them when open
    keep: frozenset[tuple[str, str]] = field(default_factory=frozenset)  # (component, code)
    keep_probes: frozenset[str] = field(default_factory=frozenset)


def _failures(result: ProbeResult) -> list[Finding]:
    """The FAIL findings of a result; a FAIL without findings names its probe (as the
    agent's verdict does)."""
    fails = [f for f in result.findings if f.status is Status.FAIL]
    if result.status is Status.FAIL and not fails:
        fails = [Finding(component=result.probe, code="fail", status=Status.FAIL)]
    return fails


def _fault(result: ProbeResult, f: Finding, policy: PolicyConfig, confirmed: bool) -> FaultIn:
    rule = policy.fault_overrides.get(f.code)
    action = rule.action if rule else (f.action if f.action is not Action.NONE else Action.MONITOR)
    urgent = rule.urgent if rule else f.urgent
    if not confirmed:  # a warning: worth remembering, never worth a take-out
        action, urgent = Action.MONITOR, False
    return FaultIn(
        f.component,
        f.code,
        f.status.value,
        action.value,
        urgent,
        f.message or result.message[:512],
        result.probe,
    )


def faults_from_report(report: NodeReport, policy: PolicyConfig) -> ReportFaults:
    """The faults ``report`` shows, with configured overrides (see the module doc)."""
    confirmed = {(c.probe, c.component, c.code) for c in report.confirmed}
    out: dict[tuple[str, str], FaultIn] = {}
    keep: set[tuple[str, str]] = set()
    keep_probes: set[str] = set()
    matched = False
    for result in report.results:
        if result.status is Status.UNKNOWN:
            keep_probes.add(result.probe)
        for f in _failures(result):
            key = (f.component, f.code)
            if (result.probe, f.component, f.code) in confirmed:
                out[key] = _fault(result, f, policy, confirmed=True)
                matched = True
            else:
                keep.add(key)
        for f in result.findings:
            key = (f.component, f.code)
            if f.status is Status.WARN and key not in out:
                out[key] = _fault(result, f, policy, confirmed=False)
    if report.verdict is Verdict.FAULTY and not matched:
        # A faulty verdict that names nothing it confirmed is still never silently
        # ignored: the node as a whole is the fault.
        action = report.action if report.action.takes_out else Action.REBOOT
        out[("node", "faulty")] = FaultIn(
            "node", "faulty", Status.FAIL.value, action.value, report.urgent, report.message
        )
    return ReportFaults(list(out.values()), frozenset(keep - set(out)), frozenset(keep_probes))
