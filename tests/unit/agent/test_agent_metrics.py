"""The agent's metrics: own registry, names, labels."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.request import urlopen

from prometheus_client import REGISTRY, generate_latest

from hyperpod_agent.agent.metrics import AgentMetrics
from hyperpod_agent.health import ProbeResult, Status, Verdict


def result(status: Status) -> ProbeResult:
    return ProbeResult(probe="gpu", status=status, duration_s=0.02, at=datetime.now(UTC))


def text(m: AgentMetrics) -> str:
    return generate_latest(m.registry).decode()


def test_own_registry_and_two_instances_coexist() -> None:
    a, b = AgentMetrics(), AgentMetrics()
    a.observe(result(Status.OK), True)
    assert "hyperpod_probe_status" not in generate_latest(REGISTRY).decode()
    assert 'hyperpod_probe_success{probe="gpu"} 1.0' in text(a)
    assert 'probe="gpu"' not in text(b)


def test_status_is_one_hot() -> None:
    m = AgentMetrics()
    m.observe(result(Status.OK), True)
    m.observe(result(Status.UNKNOWN), False)
    out = text(m)
    assert 'hyperpod_probe_status{probe="gpu",status="UNKNOWN"} 1.0' in out
    assert 'hyperpod_probe_status{probe="gpu",status="OK"} 0.0' in out
    assert 'hyperpod_probe_success{probe="gpu"} 0.0' in out
    assert 'hyperpod_probe_duration_seconds_count{probe="gpu"} 1.0' in out


def test_verdict_and_cycles() -> None:
    m = AgentMetrics()
    m.set_verdict(Verdict.HEALTHY)
    m.set_verdict(Verdict.FAULTY)
    out = text(m)
    assert 'hyperpod_node_verdict{verdict="faulty"} 1.0' in out
    assert 'hyperpod_node_verdict{verdict="healthy"} 0.0' in out
    assert "hyperpod_agent_cycles_total 2.0" in out


def test_xid_counter_reads_source() -> None:
    m = AgentMetrics()
    counts = {79: 1}
    m.set_xid_source(lambda: counts)
    assert 'hyperpod_gpu_xid_total{xid="79"} 1.0' in text(m)
    counts[13] = 4
    assert 'hyperpod_gpu_xid_total{xid="13"} 4.0' in text(m)


def test_serve_on_ephemeral_loopback_port() -> None:
    m = AgentMetrics()
    port = m.serve("127.0.0.1", 0)
    try:
        m.set_verdict(Verdict.DEGRADED)
        with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        assert 'hyperpod_node_verdict{verdict="degraded"} 1.0' in body
    finally:
        m.stop()
