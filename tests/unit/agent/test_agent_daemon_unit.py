"""The agent loop in-process: cycles, cache, reporter, sd_notify, broken probes."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from progress_records import record, write
from prometheus_client import generate_latest
from test_progress_identity import Steps, fake_steps

from hyperpod_agent.agent.cache import read_report
from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.agent.daemon import Agent, build_probes, make_reporter
from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.health import NodeReport, Status, Verdict
from hyperpod_agent.probes import registry
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig
from hyperpod_agent.sdnotify import sd_notify

ONLY_GPU = {name: {"enabled": False} for name in registry.PROBES if name != "gpu"}


def make_config(tmp_path: Path, gpus: int = 8, **extra: Any) -> AgentConfig:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"generate": gpus}))
    probes: dict[str, Any] = {
        **ONLY_GPU,
        "gpu": {
            "backend": "fake",
            "fake_scenario": str(scenario),
            "kmsg_path": None,
            "expected_count": 8,
            "interval_s": 0.1,
            "timeout_s": 1,
        },
    }
    return AgentConfig.model_validate(
        {
            "node_name": "node1",
            "cache_path": str(tmp_path / "health.json"),
            "metrics": {"enabled": False},
            "verdict": {"grace_s": 0, "fail_after_runs": 2},
            "probes": probes,
            "memory_tier": {"root": str(tmp_path / "shm")},
            "progress_dir": str(tmp_path / "progress"),
            **extra,
        }
    )


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.reports: list[NodeReport] = []
        self.fail = fail
        self.closed = False

    def publish(self, report: NodeReport) -> None:
        self.reports.append(report)
        if self.fail:
            raise ConnectionError("controller down")

    def close(self) -> None:
        self.closed = True


def test_cycle_writes_cache_and_publishes(tmp_path: Path) -> None:
    rec = Recorder()
    agent = Agent(make_config(tmp_path), reporter=rec)
    first = agent.run_once()
    assert first.verdict == Verdict.HEALTHY and first.seq == 1
    assert read_report(tmp_path / "health.json").agent_id == agent.agent_id
    second = agent.finish_cycle()
    assert second.seq == 2 and [r.seq for r in rec.reports] == [1, 2]
    agent.close()
    assert rec.closed


class Observing(Recorder):
    """A reporter in observe mode: hands what it left undone to the agent's metrics."""

    def count_would_have(self, hook: Any) -> None:
        self.hook = hook


def test_what_observe_mode_left_undone_is_in_the_agents_metrics(tmp_path: Path) -> None:
    rep = Observing()
    agent = Agent(make_config(tmp_path), reporter=rep)
    rep.hook("self_drain")
    text = generate_latest(agent.metrics.registry).decode()
    assert 'hyperpod_agent_would_have_total{action="self_drain"} 1.0' in text
    agent.close()


def test_reporter_failure_does_not_stop_the_cycle(tmp_path: Path) -> None:
    agent = Agent(make_config(tmp_path), reporter=Recorder(fail=True))
    assert agent.run_once().verdict == Verdict.HEALTHY
    agent.close()


def test_unwritable_cache_is_logged_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cfg = make_config(tmp_path, cache_path=str(blocker / "health.json"))
    agent = Agent(cfg)
    assert agent.run_once().seq == 1
    agent.close()


def test_broken_probe_constructor_becomes_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Exploding(Probe[ProbeConfig]):
        name = "cpu"
        config_model = ProbeConfig

        def __init__(self, config: ProbeConfig, context: Any) -> None:
            raise FileNotFoundError("/proc/cpuinfo")

        def check(self) -> Outcome:
            raise AssertionError("never")

    monkeypatch.setitem(registry.PROBES, "cpu", Exploding)
    cfg = make_config(tmp_path).model_copy()
    probes = build_probes(
        cfg.model_copy(
            update={
                "probes": cfg.probes.model_copy(
                    update={"cpu": cfg.probes.cpu.model_copy(update={"enabled": True})}
                )
            }
        )
    )
    out = probes["cpu"].check()
    assert out.status == Status.UNKNOWN and "FileNotFoundError" in out.message


def test_no_controller_url_means_no_reporter(tmp_path: Path) -> None:
    assert make_reporter(make_config(tmp_path)) is None


def test_a_list_of_controller_urls_makes_a_reporter(tmp_path: Path) -> None:
    # A standby pair is configured as ``urls``, with ``url`` left empty.
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    reporter = make_reporter(make_config(tmp_path, controller={"urls": urls}))
    assert reporter is not None
    reporter.close()


def test_sd_notify_sends_datagram(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sd_notify("READY=1")
        assert sock.recv(64) == b"READY=1"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not sd_notify("READY=1")


def test_run_loop_ready_then_watchdog_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        agent = Agent(make_config(tmp_path, cycle_s=0.1))
        thread = threading.Thread(target=agent.run)
        thread.start()
        try:
            assert sock.recv(64) == b"READY=1"
            assert sock.recv(64) == b"WATCHDOG=1"
            (tmp_path / "scenario.json").write_text(json.dumps({"generate": 7}))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if read_report(tmp_path / "health.json").verdict == Verdict.FAULTY:
                    break
                time.sleep(0.05)
            report = read_report(tmp_path / "health.json")
            assert report.verdict == Verdict.FAULTY and report.urgent
        finally:
            agent.stopping.set()
            thread.join(10)
            agent.close()
        assert not thread.is_alive()


def test_metrics_port_in_use_is_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = make_config(tmp_path, metrics={"enabled": True, "port": port})
        agent = Agent(cfg)
        with pytest.raises(HyperpodError, match=f"cannot listen on 127.0.0.1:{port}"):
            agent.run()
        agent.close()


@pytest.fixture
def steps() -> Iterator[Steps]:
    """Fake job steps (a root slurmstepd and its ranks): only their records count."""
    with fake_steps() as made:
        yield made


@pytest.mark.root
def test_report_carries_progress(tmp_path: Path, steps: Steps) -> None:
    progress = tmp_path / "progress"
    pid = steps.start(42).ranks[0]
    steps.start(43)
    record(progress, pid, 42, 0, step=7, step_at=time.time(), durations=[1.0, 3.0])
    write(progress, 43, 0, b"x" * 1024)  # skipped, counted
    rec = Recorder()
    agent = Agent(make_config(tmp_path, progress_dir=str(progress)), reporter=rec)
    report = agent.finish_cycle()
    (job,) = report.progress
    assert job.job_id == 42 and job.ranks[0].step == 7 and job.ranks[0].median_s == 2.0
    assert rec.reports[-1].progress == report.progress
    assert read_report(tmp_path / "health.json").progress == report.progress
    scraped = generate_latest(agent.metrics.registry).decode()
    assert 'hyperpod_agent_progress_skipped_total{reason="format"} 1.0' in scraped
    agent.close()


@pytest.mark.root
def test_a_failing_progress_reader_costs_only_the_progress(
    tmp_path: Path,
    steps: Steps,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    progress = tmp_path / "progress"
    record(progress, steps.start(42).ranks[0], 42, 0)
    agent = Agent(make_config(tmp_path, progress_dir=str(progress)), reporter=Recorder())

    def explode() -> list[Any]:
        raise RuntimeError("reader bug")

    monkeypatch.setattr(agent.progress, "read", explode)
    with caplog.at_level(logging.ERROR, logger="hyperpod_agent.agent.daemon"):
        first = agent.run_once()
        second = agent.finish_cycle()
    assert first.verdict == Verdict.HEALTHY and first.progress == []
    assert second.seq == 2 and second.progress == []
    assert sum("reader bug" in r.getMessage() for r in caplog.records) == 1  # not every cycle
    monkeypatch.undo()
    assert [j.job_id for j in agent.finish_cycle().progress] == [42]
    agent.close()


def test_reporter_gets_the_progress_interval(tmp_path: Path) -> None:
    url = {"controller": {"url": "http://127.0.0.1:9", "auth": {"mode": "none"}}}
    default = make_reporter(make_config(tmp_path, **url))
    chosen = make_reporter(make_config(tmp_path, progress_report_interval_s=30, **url))
    try:
        assert default._progress_interval_s == make_config(tmp_path).effective_cycle_s()
        assert chosen._progress_interval_s == 30
    finally:
        default.close()
        chosen.close()
