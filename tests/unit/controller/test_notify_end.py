"""``hyperpod jobs notify-end`` (EpilogSlurmctld): never fails, never hangs."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hyperpod_agent.admin import cli as admin_cli
from hyperpod_agent.admin import render
from hyperpod_agent.admin.cli import exit_code_from_env, jobs
from hyperpod_agent.client import ControllerUnreachable


class Recorder:
    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[int, int | None, str | None]] = []
        self.timeouts: list[float | None] = []
        self.fail = fail

    def make_client(self, url: Any, sock: Any, cfg: Any, timeout: float | None) -> Recorder:
        self.timeouts.append(timeout)
        return self

    def job_ended(self, job_id: int, exit_code: int | None, state: str | None) -> Any:
        if self.fail is not None:
            raise self.fail
        self.calls.append((job_id, exit_code, state))
        return {"accepted": True, "tracked": True}


@pytest.fixture
def rec(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    r = Recorder()
    monkeypatch.setattr(admin_cli, "make_client", r.make_client)
    return r


def notify(*args: str, env: dict[str, str] | None = None) -> Any:
    base = {"SLURM_JOB_ID": "", "SLURM_JOB_EXIT_CODE2": ""}
    return CliRunner().invoke(jobs, ["notify-end", *args], env={**base, **(env or {})})


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["12"], {}, (12, None, None)),
        (["12", "--exit-code", "1", "--state", "FAILED"], {}, (12, 1, "FAILED")),
        ([], {"SLURM_JOB_ID": "34", "SLURM_JOB_EXIT_CODE2": "233:0"}, (34, 233, None)),
        ([], {"SLURM_JOB_ID": "34", "SLURM_JOB_EXIT_CODE2": "0:9"}, (34, 0, None)),
        ([], {"SLURM_JOB_ID": "34", "SLURM_JOB_EXIT_CODE2": "junk"}, (34, None, None)),
        (["34", "--exit-code", "999"], {}, (34, None, None)),
        (["34", "--exit-code", "abc"], {}, (34, None, None)),
        (["34", "--exit-code", "2:0"], {}, (34, 2, None)),
        (["34", "--state", "no spaces allowed"], {}, (34, None, None)),
        (["12"], {"SLURM_JOB_ID": "34"}, (12, None, None)),
    ],
)
def test_notify_end_sends_what_it_knows(
    rec: Recorder, args: list[str], env: dict[str, str], expected: tuple[object, ...]
) -> None:
    result = notify(*args, env=env)
    assert result.exit_code == 0, result.output
    assert rec.calls == [expected]
    assert rec.timeouts == [admin_cli.NOTIFY_REQUEST_TIMEOUT_S]
    assert admin_cli.NOTIFY_REQUEST_TIMEOUT_S < admin_cli.NOTIFY_DEADLINE_S <= 2.0


@pytest.mark.parametrize("args", [[], ["abc"], ["0"], ["--", "-5"], [str(2**64)]])
def test_notify_end_without_a_valid_job_id_exits_0(rec: Recorder, args: list[str]) -> None:
    result = notify(*args)
    assert result.exit_code == 0
    assert "no valid job id" in result.output
    assert rec.calls == []


@pytest.mark.parametrize(
    "error",
    [ControllerUnreachable("http://x", "connection refused"), ValueError("bad")],
)
def test_notify_end_errors_go_to_stderr_and_exit_0(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    rec = Recorder(fail=error)
    monkeypatch.setattr(admin_cli, "make_client", rec.make_client)
    result = notify("12")
    assert result.exit_code == 0
    assert "couldn't notify" in result.output


@pytest.fixture
def admin_toml(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "admin.toml"
    path.write_text('[auth]\nmode = "none"\n')
    yield path


def test_notify_end_with_the_controller_down_exits_0(admin_toml: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    result = notify("12", "--url", f"http://127.0.0.1:{port}", "--config", str(admin_toml))
    assert result.exit_code == 0
    assert "couldn't notify" in result.output and "unreachable" in result.output


def test_notify_end_with_a_silent_controller_gives_up_and_exits_0(admin_toml: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)  # accepts connections into the backlog, never answers
        port = sock.getsockname()[1]
        result = notify("12", "--url", f"http://127.0.0.1:{port}", "--config", str(admin_toml))
    assert result.exit_code == 0
    assert "job 12" in result.output


def test_notify_end_without_any_config_exits_0(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    result = notify("12", "--config", str(missing))
    assert result.exit_code == 0 and "couldn't notify" in result.output


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0:0", 0), ("1:0", 1), ("233:0", 233), ("0:15", 0), ("", None), ("x:0", None), ("300", None)],
)
def test_exit_code_from_env(value: str, expected: int | None) -> None:
    assert exit_code_from_env(value) == expected


def test_jobs_table_shows_the_resumed_step() -> None:
    row = {
        "job_id": 12,
        "state": "RUNNING",
        "nodes": ["node2", "node3"],
        "restart_count": 1,
        "cap": 3,
        "attempts": 1,
        "tracking": "requeued",
        "resumed_from_step": 1500,
        "last_cause": "urgent fault on node1",
    }
    header, line = render.jobs_table([row]).splitlines()[:2]
    assert "FROM STEP" in header
    assert line.split()[:7] == ["12", "RUNNING", "node2,node3", "1", "1/3", "requeued", "1500"]
