"""DRAIN on the node side: the verdict carries it, the health check names it, and the
agent's own drain while the controller is unreachable writes our ``drain`` reason (the
controller resumes that once the node is healthy; it never reboots for it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hyperpod_agent.agent.healthcheck import EXIT_FAULTY, CheckSettings, judge
from hyperpod_agent.agent.selfdrain import SelfDrain, self_drain_reason
from hyperpod_agent.agent.verdict import VerdictConfig, VerdictEngine
from hyperpod_agent.health import Action, Finding, NodeReport, ProbeResult, Status, Verdict
from hyperpod_agent.reasons import Verb, parse_reason
from hyperpod_agent.slurm.models import Node

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def finding(code: str, action: Action, urgent: bool = False, component: str = "scratch") -> Finding:
    return Finding(component=component, code=code, status=Status.FAIL, action=action,
                   urgent=urgent, message="0.5% space free")  # fmt: skip


def result(probe: str, *findings: Finding, run: int = 0) -> ProbeResult:
    return ProbeResult(probe=probe, status=Status.FAIL, findings=list(findings),
                       at=T0 + timedelta(seconds=run))  # fmt: skip


def engine(n: int = 2) -> VerdictEngine:
    return VerdictEngine(VerdictConfig(fail_after_runs=n, grace_s=0.0), started=0.0)


# --- the verdict ---------------------------------------------------------------------------


def test_a_confirmed_drain_finding_makes_the_node_faulty_asking_for_a_drain() -> None:
    e = engine(n=2)
    full = finding("fs_full", Action.DRAIN)
    first = e.evaluate([result("disk", full, run=0)], now=100)
    assert first.verdict is Verdict.DEGRADED  # damped like any other FAIL
    v = e.evaluate([result("disk", full, run=1)], now=101)
    assert (v.verdict, v.action, v.urgent) == (Verdict.FAULTY, Action.DRAIN, False)
    assert v.message == "scratch fs_full DRAIN"
    assert [(c.probe, c.code) for c in v.confirmed] == [("disk", "fs_full")]


def test_a_stronger_fault_beside_a_drain_is_what_the_verdict_asks_for() -> None:
    e = engine(n=1)
    v = e.evaluate(
        [result("disk", finding("fs_full", Action.DRAIN)),
         result("gpu", finding("nvlink_down", Action.RESET, component="gpu1"))],
        now=100,
    )  # fmt: skip
    assert v.action is Action.RESET and len(v.faults) == 2


def test_a_drain_outranks_a_monitor_fault() -> None:
    v = engine(n=1).evaluate(
        [result("disk", finding("fs_full", Action.DRAIN)),
         result("script", finding("script_fail", Action.MONITOR, component="site"))],
        now=100,
    )  # fmt: skip
    assert v.action is Action.DRAIN


# --- the health check -------------------------------------------------------------------------


def test_the_health_check_names_the_drain() -> None:
    data = {
        "node": "node1",
        "verdict": "faulty",
        "generated_at": T0.isoformat(),
        "action": "DRAIN",
        "message": "scratch fs_full DRAIN",
    }
    code, line = judge(data, T0 + timedelta(seconds=1), CheckSettings())
    assert (code, line) == (EXIT_FAULTY, "node1: faulty (action DRAIN): scratch fs_full DRAIN")


# --- the agent's own drain ---------------------------------------------------------------------


def report(*findings: Finding, action: Action = Action.DRAIN) -> NodeReport:
    return NodeReport(
        node="node1", agent_id="a", seq=1, generated_at=T0, verdict=Verdict.FAULTY,
        action=action, urgent=any(f.urgent for f in findings), message="scratch fs_full",
        results=[result("disk", *findings)],
    )  # fmt: skip


def test_self_drain_for_an_urgent_drain_writes_our_drain_reason() -> None:
    key, reason = self_drain_reason(report(finding("fs_full", Action.DRAIN, urgent=True)))
    assert key == "scratch fs_full"
    assert reason == "hyperpod:drain scratch fs_full 0.5% space free"
    ours = parse_reason(reason)
    assert ours is not None and ours.verb is Verb.DRAIN


def test_self_drain_without_findings_asking_for_a_drain_writes_our_drain_reason() -> None:
    bare = report(action=Action.DRAIN).model_copy(update={"urgent": True})
    assert self_drain_reason(bare)[1] == "hyperpod:drain node fault scratch fs_full"


class RecordingSlurm:
    """Slurm as self-drain sees it; anything but a drain would be recorded too."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def node(self, name: str) -> Node:
        return Node(name=name, state="ALLOCATED")

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node, reason))


def test_the_agents_own_drain_for_a_full_disk_only_drains() -> None:
    slurm = RecordingSlurm()
    sd = SelfDrain("node1", slurm, enabled=True, after_s=30, min_interval_s=600, retry_s=10,
                   slurm_user="slurm")  # fmt: skip
    full = report(finding("fs_full", Action.DRAIN, urgent=True))
    assert sd.due(full, down_since=0.0) == 30.0
    sd.run(full, now=31.0, down_for=31.0)
    assert slurm.calls == [("drain", "node1", "hyperpod:drain scratch fs_full 0.5% space free")]
    assert sd.due(full, down_since=0.0) is None  # once per fault
