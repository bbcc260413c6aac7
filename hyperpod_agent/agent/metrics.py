"""Every metric the agent exports, on its own registry (never the global one).

Labels stay low-cardinality: probe names, statuses, verdicts and XID numbers. Which
component failed is in the health cache and the report, not in label values.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from hyperpod_agent.health import ProbeResult, Status, Verdict

log = logging.getLogger(__name__)

XidSource = Callable[[], dict[int, int]]


class _XidCollector(Collector):
    """hyperpod_gpu_xid_total{xid}: read from the gpu probe's cumulative counts at
    scrape time, so the probe needs no metrics code."""

    def __init__(self) -> None:
        self.source: XidSource | None = None

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "hyperpod_gpu_xid", "XID events seen on this node's GPUs", labels=["xid"]
        )
        counts = self.source() if self.source is not None else {}
        for xid, count in sorted(dict(counts).items()):
            family.add_metric([str(xid)], float(count))
        yield family


class AgentMetrics:
    """The agent's metrics and, once ``serve`` is called, its HTTP endpoint."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.probe_status = Gauge(
            "hyperpod_probe_status",
            "1 for the latest status of each probe",
            ["probe", "status"],
            registry=r,
        )
        self.probe_duration = Histogram(
            "hyperpod_probe_duration_seconds",
            "Probe run time",
            ["probe"],
            registry=r,
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
        )
        self.probe_success = Gauge(
            "hyperpod_probe_success",
            "1 if the probe's last run completed (no crash, no timeout), whatever it found",
            ["probe"],
            registry=r,
        )
        self.node_verdict = Gauge(
            "hyperpod_node_verdict",
            "1 for the node's current verdict",
            ["verdict"],
            registry=r,
        )
        self.cycles = Counter(
            "hyperpod_agent_cycles",
            "Verdict cycles completed",
            registry=r,
        )
        self.memory_tiers_freed = Counter(
            "hyperpod_agent_memory_tiers_freed",
            "Checkpoint memory tiers of finished jobs removed from this node",
            registry=r,
        )
        self.progress_skipped = Counter(
            "hyperpod_agent_progress_skipped",
            "Progress records not used, by reason; once per file and reason, not per cycle",
            ["reason"],
            registry=r,
        )
        self.would_have = Counter(
            "hyperpod_agent_would_have",
            'What mode = "observe" left undone, by action (self_drain)',
            ["action"],
            registry=r,
        )
        self._xids = _XidCollector()
        r.register(self._xids)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def set_xid_source(self, source: XidSource) -> None:
        """Where hyperpod_gpu_xid_total reads its counts."""
        self._xids.source = source

    def observe(self, result: ProbeResult, ran: bool) -> None:
        """Record one probe result (the runner's observer)."""
        for status in Status:
            self.probe_status.labels(result.probe, status.value).set(
                1.0 if result.status == status else 0.0
            )
        self.probe_success.labels(result.probe).set(1.0 if ran else 0.0)
        if ran:
            self.probe_duration.labels(result.probe).observe(result.duration_s)

    def set_verdict(self, verdict: Verdict) -> None:
        """Record the node verdict of a cycle."""
        for v in Verdict:
            self.node_verdict.labels(v.value).set(1.0 if v == verdict else 0.0)
        self.cycles.inc()

    def serve(self, address: str, port: int) -> int:
        """Serve /metrics on ``address:port`` in a daemon thread; the bound port."""
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(port, addr=address, registry=self.registry)
        bound = int(self._server.server_address[1])
        log.info("metrics on http://%s:%d/metrics", address, bound)
        return bound

    def stop(self) -> None:
        """Stop the HTTP endpoint."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
