"""Every query of the Grafana dashboard, run by a real Prometheus on the real metrics.

A Prometheus on loopback scrapes the agent's own endpoint (``AgentMetrics.serve``) and
the controller's and checkpoint library's registries, served from a separate process
(metrics_server.py). Every panel and variable query must then evaluate without error,
and every metric the dashboard names must have series: a wrong name, a wrong suffix or
invalid PromQL fails here, not on a cluster.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ops_dashboard import expressions, load, metric_names

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
# Grafana's macros and this dashboard's variables, as Grafana would expand them.
MACROS = {
    "$__rate_interval": "1m",
    "$__range": "5m",
    "$__interval": "15s",
    "$instance": ".*",
    "$probe": ".*",
}
_LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$")
DEADLINE_S = 60.0


def expand(expr: str) -> str:
    """PromQL as Grafana sends it; ``label_values(sel, label)`` becomes ``sel``."""
    for macro, value in MACROS.items():
        expr = expr.replace(macro, value)
    m = _LABEL_VALUES.match(expr.strip())
    return m.group(1) if m else expr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(base: str, path: str, **params: str) -> dict[str, Any]:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 400/422 carry the PromQL error as JSON
        data = json.loads(exc.read())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus not found: apt-get install prometheus (scripts/setup.sh)")
    tmp = tmp_path_factory.mktemp("prom")
    server = subprocess.Popen(
        [sys.executable, str(HERE / "metrics_server.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    prom: subprocess.Popen[bytes] | None = None
    try:
        assert server.stdout is not None
        ports = json.loads(server.stdout.readline())
        jobs = "\n".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']"
            for job, port in ports.items()
        )
        config = tmp / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{jobs}\n"
        )
        port = free_port()
        with (tmp / "prometheus.log").open("wb") as log:  # the child keeps its own fd
            prom = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        base = f"http://127.0.0.1:{port}"
        wait_for_scrapes(base, prom, len(ports), tmp / "prometheus.log")
        yield base
    finally:
        for proc in (prom, server):
            if proc is None:
                continue
            if proc is server:
                for pipe in (server.stdin, server.stdout):
                    if pipe is not None:
                        pipe.close()
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def wait_for_scrapes(base: str, prom: subprocess.Popen[bytes], jobs: int, log: Path) -> None:
    """Until every target was scraped twice: rate() needs two points."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if prom.poll() is not None:
            pytest.fail(f"prometheus exited {prom.returncode}: {log.read_text()[-2000:]}")
        try:
            data = api(base, "/api/v1/query", query="count_over_time(up[1m]) >= 2")
            if data["status"] == "success" and len(data["data"]["result"]) == jobs:
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.3)
    pytest.fail(f"targets not scraped within {DEADLINE_S:g}s: {log.read_text()[-2000:]}")


def test_every_query_evaluates(prometheus: str) -> None:
    errors = []
    for where, expr in expressions(load()):
        data = api(prometheus, "/api/v1/query", query=expand(expr))
        if data["status"] != "success":
            errors.append(f"{where}: {data.get('error')}: {expand(expr)}")
    assert errors == []


def test_every_named_metric_has_series(prometheus: str) -> None:
    names = {n for _, e in expressions(load()) for n in metric_names(e)}
    empty = []
    for name in sorted(names):
        data = api(prometheus, "/api/v1/query", query=f'count({{__name__="{name}"}})')
        if data["status"] != "success" or not data["data"]["result"]:
            empty.append(name)
    assert empty == []


def test_quantiles_and_filters_see_the_served_values(prometheus: str) -> None:
    # Spot checks that the queries read what the code put there.
    def value(expr: str) -> float:
        result = api(prometheus, "/api/v1/query", query=expand(expr))["data"]["result"]
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    assert value('sum(hyperpod_controller_nodes_health{verdict="faulty"}) or vector(0)') == 1
    assert value('count(hyperpod_probe_success{instance=~"$instance"} == 0)') == 1
    assert value('sum(hyperpod_node_verdict{verdict="faulty"})') == 1
    # One observation of 1.5 s: the median lies inside its bucket, (1, 2].
    p50 = value("histogram_quantile(0.5, sum by (le) (hyperpod_fault_to_drain_seconds_bucket))")
    assert 1 < p50 <= 2


def test_a_broken_query_is_reported(prometheus: str) -> None:
    data = api(prometheus, "/api/v1/query", query="sum(rate(hyperpod_faults_total[1m])")
    assert data["status"] == "error"
    data = api(prometheus, "/api/v1/query", query='count({__name__="hyperpod_faults"})')
    assert data["status"] == "success" and data["data"]["result"] == []
