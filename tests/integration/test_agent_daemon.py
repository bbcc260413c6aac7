"""The agent as a real process: fake GPUs, a live XID 79 drill, metrics, SIGTERM.

Only the GPUs are fake (a scenario file); the process, cache, HTTP endpoint, signals
and the health-check command are the real ones.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest

CYCLE_S = 0.5


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_cache(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def wait_for(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture()
def setup(tmp_path: Path) -> dict[str, Any]:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"generate": 8}))
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    port = free_port()
    config = tmp_path / "agent.toml"
    config.write_text(f"""
node_name = "node1"
cache_path = "{tmp_path / "run" / "health.json"}"
cycle_s = {CYCLE_S}
[metrics]
address = "127.0.0.1"
port = {port}
[verdict]
grace_s = 0
[memory_tier]
root = "{tmp_path / "shm"}"
[health_check]
stale_after_s = 5
[probes.gpu]
backend = "fake"
fake_scenario = "{scenario}"
kmsg_path = "{kmsg}"
expected_count = 8
interval_s = {CYCLE_S}
[probes.slurmd]
enabled = false
[probes.script]
enabled = false
""")
    return {
        "config": config,
        "scenario": scenario,
        "port": port,
        "cache": tmp_path / "run" / "health.json",
    }


@pytest.fixture()
def agent(setup: dict[str, Any]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hyperpod_agent.agent.cli", "run", "--config", str(setup["config"])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_xid79_drill_metrics_and_clean_sigterm(
    setup: dict[str, Any], agent: subprocess.Popen[str]
) -> None:
    cache = setup["cache"]
    first = wait_for(lambda: read_cache(cache), 30, "the first health cache")
    assert first["node"] == "node1" and first["verdict"] in ("healthy", "degraded")
    wait_for(lambda: (read_cache(cache) or {}).get("verdict") == "healthy", 10, "healthy")

    setup["scenario"].write_text(
        json.dumps(
            {
                "generate": 8,
                "xid_events": [{"gpu": 3, "xid": 79, "message": "GPU has fallen off the bus"}],
            }
        )
    )
    seq_at_edit = read_cache(cache)["seq"]  # type: ignore[index]
    faulty = wait_for(
        lambda: (c := read_cache(cache)) and c["verdict"] == "faulty" and c, 10, "faulty"
    )
    assert faulty["seq"] <= seq_at_edit + 2, "not within two cycles"
    assert (faulty["action"], faulty["urgent"]) == ("REBOOT", True)
    assert "gpu3 xid79" in faulty["message"]

    with urlopen(f"http://127.0.0.1:{setup['port']}/metrics", timeout=5) as resp:
        body = resp.read().decode()
    assert 'hyperpod_gpu_xid_total{xid="79"} 1.0' in body
    assert 'hyperpod_node_verdict{verdict="faulty"} 1.0' in body
    assert 'hyperpod_probe_status{probe="gpu",status="FAIL"} 1.0' in body
    assert "hyperpod_agent_cycles_total" in body

    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "from hyperpod_agent.agent.healthcheck import health_check; health_check()",
            "--config",
            str(setup["config"]),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert check.returncode == 1
    assert "faulty (action REBOOT urgent)" in check.stderr

    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
    _, stderr = agent.communicate(timeout=10)
    assert "Traceback" not in stderr
    assert "agent stopped" in stderr


def test_stale_cache_after_agent_stops(setup: dict[str, Any], agent: subprocess.Popen[str]) -> None:
    wait_for(lambda: read_cache(setup["cache"]), 30, "the first health cache")
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
    cmd = [
        sys.executable,
        "-c",
        "from hyperpod_agent.agent.healthcheck import health_check; health_check()",
        "--config",
        str(setup["config"]),
        "--stale-after",
        "0.2",
    ]
    time.sleep(0.3)
    check = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert check.returncode == 2 and "cache stale" in check.stderr


def test_invalid_config_refuses_to_start(tmp_path: Path) -> None:
    bad = tmp_path / "agent.toml"
    bad.write_text('[probes.gpu]\nexpected_count = "eight"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "hyperpod_agent.agent.cli", "run", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"hyperpod: error: {bad}: probes.gpu.expected_count: "
        'Input should be a valid integer, got "eight"'
    ]
