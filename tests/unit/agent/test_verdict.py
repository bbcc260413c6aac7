"""Node verdict: aggregation, flap damping, start-up grace, UNKNOWN handling."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hyperpod_agent.agent.verdict import VerdictConfig, VerdictEngine
from hyperpod_agent.health import Action, Finding, ProbeResult, Status, Verdict

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def res(
    probe: str, status: Status, *findings: Finding, run: int = 0, message: str = ""
) -> ProbeResult:
    return ProbeResult(
        probe=probe,
        status=status,
        findings=list(findings),
        message=message,
        at=T0 + timedelta(seconds=run),
    )


def fail(
    code: str = "nvlink_down",
    action: Action = Action.RESET,
    urgent: bool = False,
    component: str = "gpu1",
) -> Finding:
    return Finding(component=component, code=code, status=Status.FAIL, action=action, urgent=urgent)


def warn(code: str = "thermal") -> Finding:
    return Finding(component="gpu0", code=code, status=Status.WARN, action=Action.MONITOR)


def engine(n: int = 2, grace: float = 0.0, urgent_in_grace: bool = True) -> VerdictEngine:
    return VerdictEngine(
        VerdictConfig(fail_after_runs=n, grace_s=grace, urgent_in_grace=urgent_in_grace),
        started=0.0,
    )


def test_all_ok_is_healthy() -> None:
    v = engine().evaluate([res("gpu", Status.OK), res("nic", Status.OK)], now=100)
    assert (v.verdict, v.action, v.urgent) == (Verdict.HEALTHY, Action.NONE, False)


def test_warn_is_degraded_with_its_action() -> None:
    v = engine().evaluate([res("gpu", Status.WARN, warn())], now=100)
    assert (v.verdict, v.action) == (Verdict.DEGRADED, Action.MONITOR)
    assert "gpu0 thermal" in v.message


def test_unknown_is_degraded_never_faulty() -> None:
    e = engine(n=1)
    for run in range(5):
        v = e.evaluate(
            [res("disk", Status.UNKNOWN, run=run, message="timed out after 10s")], now=100 + run
        )
    assert v.verdict == Verdict.DEGRADED
    assert "disk unknown: timed out after 10s" in v.message


def test_fail_needs_n_consecutive_runs() -> None:
    e = engine(n=3)
    verdicts = [
        e.evaluate([res("gpu", Status.FAIL, fail(), run=r)], now=100 + r).verdict for r in range(3)
    ]
    assert verdicts == [Verdict.DEGRADED, Verdict.DEGRADED, Verdict.FAULTY]


def test_same_run_evaluated_twice_counts_once() -> None:
    e = engine(n=2)
    r = res("gpu", Status.FAIL, fail(), run=1)
    assert e.evaluate([r], now=100).verdict == Verdict.DEGRADED
    assert e.evaluate([r], now=101).verdict == Verdict.DEGRADED
    assert e.evaluate([res("gpu", Status.FAIL, fail(), run=2)], now=102).verdict == Verdict.FAULTY


def test_flap_resets_strikes() -> None:
    e = engine(n=2)
    e.evaluate([res("gpu", Status.FAIL, fail(), run=1)], now=100)
    e.evaluate([res("gpu", Status.OK, run=2)], now=101)
    v = e.evaluate([res("gpu", Status.FAIL, fail(), run=3)], now=102)
    assert v.verdict == Verdict.DEGRADED and "pending (1/2)" in v.message


def test_unknown_run_neither_confirms_nor_clears() -> None:
    e = engine(n=2)
    e.evaluate([res("gpu", Status.FAIL, fail(), run=1)], now=100)
    e.evaluate([res("gpu", Status.UNKNOWN, run=2)], now=101)
    assert e.evaluate([res("gpu", Status.FAIL, fail(), run=3)], now=102).verdict == Verdict.FAULTY


def test_urgent_is_faulty_at_once() -> None:
    v = engine(n=5).evaluate(
        [res("gpu", Status.FAIL, fail("xid79", Action.REBOOT, urgent=True, component="gpu3"))],
        now=100,
    )
    assert (v.verdict, v.action, v.urgent) == (Verdict.FAULTY, Action.REBOOT, True)
    assert "gpu3 xid79 REBOOT urgent" in v.message


def test_strongest_action_wins() -> None:
    e = engine(n=1)
    v = e.evaluate(
        [
            res(
                "gpu",
                Status.FAIL,
                fail("row_remap_failure", Action.REPLACE),
                fail("nvlink_down", Action.RESET),
            ),
            res("nic", Status.FAIL, fail("link_down", Action.REBOOT, component="ib0")),
        ],
        now=100,
    )
    assert v.action == Action.REPLACE and len(v.faults) == 3


def test_grace_holds_non_urgent_fail() -> None:
    e = engine(n=1, grace=60)
    v = e.evaluate([res("slurmd", Status.FAIL, fail("not_running", component="slurmd"))], now=10)
    assert v.verdict == Verdict.DEGRADED and "start-up grace" in v.message
    v = e.evaluate(
        [res("slurmd", Status.FAIL, fail("not_running", component="slurmd"), run=1)], now=61
    )
    assert v.verdict == Verdict.FAULTY


def test_urgent_bypasses_grace_unless_configured() -> None:
    urgent = res("gpu", Status.FAIL, fail("gpu_lost", Action.REBOOT, urgent=True))
    assert engine(grace=60).evaluate([urgent], now=1).verdict == Verdict.FAULTY
    held = engine(grace=60, urgent_in_grace=False).evaluate([urgent], now=1)
    assert held.verdict == Verdict.DEGRADED


def test_fail_without_findings_names_probe() -> None:
    v = engine(n=1).evaluate([res("script", Status.FAIL, message="check-fs exited 1")], now=100)
    assert v.verdict == Verdict.FAULTY and "script fail" in v.message


def test_message_is_bounded() -> None:
    many = [fail(f"code{i}", component=f"gpu{i}") for i in range(60)]
    v = engine(n=1).evaluate([res("gpu", Status.FAIL, *many)], now=100)
    assert len(v.message) <= 1024


def test_pending_fail_with_warn_is_degraded_with_warn_action() -> None:
    v = engine(n=3).evaluate([res("gpu", Status.FAIL, fail(), warn())], now=100)
    assert (v.verdict, v.action, v.urgent) == (Verdict.DEGRADED, Action.MONITOR, False)
    assert "gpu1 nvlink_down pending (1/3)" in v.message and "gpu0 thermal" in v.message


def test_unknown_finding_message_is_shown() -> None:
    unk = Finding(
        component="kmsg",
        code="source_error",
        status=Status.UNKNOWN,
        message="cannot read /dev/kmsg",
    )
    v = engine().evaluate([res("gpu", Status.UNKNOWN, unk)], now=100)
    assert v.verdict == Verdict.DEGRADED
    assert v.message == "kmsg source_error unknown: cannot read /dev/kmsg"


def test_fault_clears_when_probe_recovers() -> None:
    e = engine(n=1)
    assert e.evaluate([res("gpu", Status.FAIL, fail(), run=1)], now=100).verdict == Verdict.FAULTY
    assert e.evaluate([res("gpu", Status.OK, run=2)], now=101).verdict == Verdict.HEALTHY


def test_confirmed_lists_what_the_verdict_acts_on_with_its_probe() -> None:
    from hyperpod_agent.health import FaultRef

    e = engine(n=2, grace=30.0)
    pending = res("nic", Status.FAIL, fail("link_down", component="ib0"), run=0)
    urgent = res("gpu", Status.FAIL, fail("xid79", Action.REBOOT, urgent=True), run=0)
    v = e.evaluate([pending, urgent], now=1.0)
    # In grace and 1 of 2 strikes: only the urgent finding is confirmed.
    assert v.confirmed == [FaultRef(probe="gpu", component="gpu1", code="xid79")]
    again = res("nic", Status.FAIL, fail("link_down", component="ib0"), run=1)
    v = e.evaluate([again, urgent], now=2.0)
    assert [c.code for c in v.confirmed] == ["xid79"]  # link_down confirmed but held
    v = e.evaluate([again, urgent], now=40.0)
    assert sorted((c.probe, c.code) for c in v.confirmed) == [
        ("gpu", "xid79"),
        ("nic", "link_down"),
    ]
