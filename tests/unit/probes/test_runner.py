"""The probe runner: cadence, timeouts, crashes -> UNKNOWN, hung probes."""

from __future__ import annotations

import threading
import time
from typing import Any

from hyperpod_agent.health import ProbeResult, Status
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig, ProbeContext
from hyperpod_agent.probes.runner import ProbeRunner

CTX = ProbeContext(node_name="node1")


class Counting(Probe[ProbeConfig]):
    name = "counting"
    config_model = ProbeConfig

    def __init__(self, config: ProbeConfig, status: Status = Status.OK) -> None:
        super().__init__(config, CTX)
        self.runs = 0
        self.status = status

    def check(self) -> Outcome:
        self.runs += 1
        return Outcome(self.status, f"run {self.runs}")


class Raising(Probe[ProbeConfig]):
    name = "raising"
    config_model = ProbeConfig

    def check(self) -> Outcome:
        raise RuntimeError("sysfs went away")


class Hanging(Probe[ProbeConfig]):
    name = "hanging"
    config_model = ProbeConfig

    def __init__(self, config: ProbeConfig) -> None:
        super().__init__(config, CTX)
        self.release = threading.Event()
        self.runs = 0

    def check(self) -> Outcome:
        self.runs += 1
        self.release.wait(30)
        return Outcome(Status.FAIL, "late")


class WrongType(Probe[ProbeConfig]):
    name = "wrong"
    config_model = ProbeConfig

    def check(self) -> Any:
        return "ok"


def cfg(interval: float = 1.0, timeout: float = 1.0) -> ProbeConfig:
    return ProbeConfig(interval_s=interval, timeout_s=timeout)


def test_ok_result_has_name_duration_and_time() -> None:
    runner = ProbeRunner({"a": Counting(cfg())})
    [res] = runner.run_once()
    assert (res.probe, res.status, res.message) == ("a", Status.OK, "run 1")
    assert res.duration_s >= 0 and res.at.tzinfo is not None
    assert runner.latest["a"] == res


def test_raise_becomes_unknown_with_error_text() -> None:
    seen: list[tuple[str, bool]] = []
    runner = ProbeRunner(
        {"r": Raising(cfg(), CTX)}, observer=lambda r, ok: seen.append((r.probe, ok))
    )
    [res] = runner.run_once()
    assert res.status == Status.UNKNOWN
    assert "RuntimeError: sysfs went away" in res.message
    assert seen == [("r", False)]


def test_wrong_return_type_is_unknown() -> None:
    [res] = ProbeRunner({"w": WrongType(cfg(), CTX)}).run_once()
    assert res.status == Status.UNKNOWN and "not Outcome" in res.message


def test_fail_status_is_kept_and_counts_as_ran() -> None:
    seen: list[bool] = []
    runner = ProbeRunner(
        {"f": Counting(cfg(), Status.FAIL)}, observer=lambda r, ok: seen.append(ok)
    )
    assert runner.run_once()[0].status == Status.FAIL
    assert seen == [True]


def test_timeout_is_unknown_and_does_not_hold_up_others() -> None:
    hang = Hanging(cfg(timeout=0.2))
    fast = Counting(cfg())
    runner = ProbeRunner({"hang": hang, "fast": fast})
    t0 = time.monotonic()
    results = {r.probe: r for r in runner.run_once()}
    assert time.monotonic() - t0 < 5
    assert results["fast"].status == Status.OK
    assert results["hang"].status == Status.UNKNOWN
    assert "timed out after 0.2s" in results["hang"].message
    hang.release.set()


def test_hung_probe_is_skipped_and_others_keep_cadence() -> None:
    hang = Hanging(cfg(interval=0.1, timeout=0.15))
    fast = Counting(cfg(interval=0.1))
    results: list[ProbeResult] = []
    runner = ProbeRunner({"hang": hang, "fast": fast}, observer=lambda r, ok: results.append(r))
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        runner.cycle(max_wait=0.05)
        time.sleep(0.02)
    hang.release.set()
    assert fast.runs >= 4  # ~10 due times in 1 s; slack for a loaded machine
    assert hang.runs == 1  # never started twice while the first run hangs
    hang_msgs = [r.message for r in results if r.probe == "hang"]
    assert any(m.startswith("timed out") for m in hang_msgs)
    assert any(m.startswith("still running after") for m in hang_msgs)
    assert all(r.status == Status.UNKNOWN for r in results if r.probe == "hang")


def test_late_result_after_timeout_is_discarded_and_probe_runs_again() -> None:
    hang = Hanging(cfg(interval=0.05, timeout=0.05))
    runner = ProbeRunner({"hang": hang})
    runner.run_once()
    hang.release.set()
    time.sleep(0.1)
    assert [r.message for r in runner.collect()] == []  # "late" FAIL never shows up
    runner.start_due(force=True)
    runner.wait(time.monotonic() + 1)
    [res] = runner.collect()
    assert res.status == Status.FAIL and hang.runs == 2


def test_cadence_follows_interval() -> None:
    slow = Counting(cfg(interval=10))
    runner = ProbeRunner({"slow": slow})
    for _ in range(3):
        runner.cycle(max_wait=0.5)
    assert slow.runs == 1
    assert runner.next_due() > time.monotonic() + 5


def test_close_survives_a_raising_close() -> None:
    class BadClose(Counting):
        def close(self) -> None:
            raise OSError("boom")

    ProbeRunner({"b": BadClose(cfg())}).close()
