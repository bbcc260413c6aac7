"""Serve the real metrics of the agent, the controller and the checkpoint library.

Run as a separate process (``python metrics_server.py``) so the values set here never
reach the registries of the test process. Prints one JSON line with the three ports,
then serves until stdin closes. Every labelled family gets a child, so every query of
the dashboard has series to work on.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

from prometheus_client import REGISTRY, start_http_server

from hyperpod_agent.agent.metrics import AgentMetrics
from hyperpod_agent.checkpoint import metrics as ckpt
from hyperpod_agent.controller import metrics as ctl
from hyperpod_agent.health import ProbeResult, Status, Verdict


def agent() -> int:
    m = AgentMetrics()
    m.set_xid_source(lambda: {79: 1, 13: 4})
    now = datetime.now(UTC)
    m.observe(ProbeResult(probe="gpu", status=Status.FAIL, duration_s=0.02, at=now), True)
    m.observe(ProbeResult(probe="disk", status=Status.UNKNOWN, at=now), False)
    m.set_verdict(Verdict.FAULTY)
    return m.serve("127.0.0.1", 0)


def controller() -> int:
    ctl.NODES.labels("IDLE").set(3)
    ctl.NODES.labels("IDLE+DRAIN").set(1)
    ctl.NODES_HEALTH.labels("healthy").set(3)
    ctl.NODES_HEALTH.labels("faulty").set(1)
    ctl.INCIDENT.set(0)
    ctl.FAULTS.labels("xid79").inc()
    for kind, outcome in (
        ("drain", "done"),
        ("requeue", "done"),
        ("exhaust", "done"),
        ("reboot", "failed"),
    ):
        ctl.ACTIONS.labels(kind, outcome).inc()
    ctl.FAULT_TO_DRAIN.observe(1.5)
    ctl.REQUEUES.inc()
    ctl.REPORTS.labels("report", "accepted").inc()
    ctl.PASSES.labels("ok").inc()
    ctl.PASS_SECONDS.observe(0.05)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=ctl.REGISTRY)
    return int(server.server_address[1])


def checkpoint() -> int:
    ckpt.SAVE_BLOCKED.observe(0.2)
    for tier in ("memory", "persistent"):
        ckpt.BYTES_WRITTEN.labels(tier).inc(1 << 20)
        ckpt.TIER_FAILURES.labels(tier).inc(0)
        ckpt.RESTORES.labels(tier).inc()
        ckpt.FALLBACKS.labels(tier).inc(0)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=REGISTRY)
    return int(server.server_address[1])


def main() -> None:
    ports = {"agent": agent(), "controller": controller(), "checkpoint": checkpoint()}
    sys.stdout.write(json.dumps(ports) + "\n")
    sys.stdout.flush()
    sys.stdin.read()  # until the test closes our stdin


if __name__ == "__main__":
    main()
