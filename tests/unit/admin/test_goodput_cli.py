"""``hyperpod goodput`` and the goodput block of ``hyperpod jobs show``, against a stub
controller answering what the controller's own computation answers."""

from __future__ import annotations

import json
import urllib.parse
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner

from hyperpod_agent.admin import cli as admin_cli
from hyperpod_agent.admin.cli import goodput, jobs
from hyperpod_agent.admin.goodput import duration, lost
from hyperpod_agent.controller.goodput import JobRecord, cluster_goodput, job_goodput
from hyperpod_agent.controller.store.rows import EventRow

if TYPE_CHECKING:
    from conftest import Stub

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
T0 = NOW.timestamp() - 3600


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin_cli, "_now", lambda: NOW)


def event(i: int, at: float, kind: str, node: str | None, job: int | None) -> EventRow:
    return EventRow(i, T0 + at, kind, node, job, "gpu3 xid79" if kind == "fault" else "", kind)


# Job 7 (2 nodes) retried in place after a fault on n2 at 1000 s; job 8 (4 nodes) ran on.
EVENTS = [
    event(1, 1000, "fault", "n2", None),
    event(2, 1001, "step_end", None, 7),
    event(3, 1003, "step_retry_planned", "n2", 7),
    event(4, 1004, "step_retry_drain", "n2", 7),
    event(5, 1005, "step_retry_shrink", "n2", 7),
    event(6, 1010, "step_retry_done", "n2", 7),
]
JOB7 = JobRecord(7, "RUNNING", T0, None, frozenset({"n1", "n2"}), 2)
JOB8 = JobRecord(8, "RUNNING", T0, None, frozenset({"n5"}), 4)
ONE = job_goodput(JOB7, EVENTS, [], NOW.timestamp()).model_dump(mode="json")
ALL = cluster_goodput([JOB7, JOB8], EVENTS, [], NOW.timestamp()).model_dump(mode="json")


def run(stub: Stub, *args: str) -> Any:
    return CliRunner().invoke(goodput, [*args, "--config", str(stub.config)])


def test_the_cluster_table(stub: Stub) -> None:
    stub.answer("GET", "/v1/goodput", 200, ALL)
    result = run(stub)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "ETTR:        0.999 (node time, each job weighted by its nodes)" in out
    assert "jobs:        2" in out and "wall:        6h00m node time" in out
    assert "checkpoint  unknown  not known in full for 2 of 2 jobs" in out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("JOB"))
    assert header.split() == [
        "JOB", "STATE", "NODES", "WALL", "PRODUCTIVE", "ETTR", "INCIDENTS", "UNACCOUNTED",
        "MOST", "LOST",
    ]  # fmt: skip
    row7 = next(line for line in lines if line.startswith("7 "))
    assert row7.split() == [
        "7",
        "RUNNING",
        "2",
        "1h00m",
        "59m50s",
        "0.997",
        "1",
        "0.0s",
        "spare_in",
        "5.0s",
    ]
    assert stub.seen[0].path == "/v1/goodput"


def test_one_job(stub: Stub) -> None:
    stub.answer("GET", "/v1/jobs/7/goodput", 200, ONE)
    result = run(stub, "--job", "7")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "ETTR:        0.997" in out and "productive:  59m50s" in out
    assert "detection   1.0s" in out and "spare_in    5.0s" in out
    assert "checkpoint  unknown  no progress records of the job" in out
    assert "restart     unknown  the first new step is not recorded" in out
    incidents = out.split("Incidents:\n")[1].splitlines()
    assert incidents[0].split()[:5] == ["STARTED", "PATH", "NODE", "DETECTION", "DRAIN"]
    assert "step_retry" in incidents[1] and " n2 " in incidents[1]


def test_json_is_the_raw_answer(stub: Stub) -> None:
    stub.answer("GET", "/v1/goodput", 200, ALL)
    assert json.loads(run(stub, "--json").output) == ALL


def test_since_goes_as_an_iso_time(stub: Stub) -> None:
    stub.answer("GET", "/v1/jobs/7/goodput", 200, ONE)
    assert run(stub, "--job", "7", "--since", "2h").exit_code == 0
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(stub.seen[0].path).query)
    assert datetime.fromisoformat(query["since"][0]) == NOW - timedelta(hours=2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--job", "0"], "Invalid value for '--job': 0 is not in the range"),
        (["--job", "seven"], "Invalid value for '--job': 'seven' is not a valid integer"),
        (["--since", "yesterday-ish"], "Invalid value for '--since': 'yesterday-ish' is neither"),
        (
            ["--since", "2026-11-28T00:00:00"],
            "Invalid value for '--since': 2026-11-28T00:00:00+00:00 is in the future",
        ),
    ],
)
def test_bad_arguments_are_usage_errors(stub: Stub, args: list[str], message: str) -> None:
    result = run(stub, *args)
    assert result.exit_code == 2
    assert message in result.output
    assert stub.seen == []


def test_a_job_the_controller_does_not_know_is_one_line(stub: Stub) -> None:
    error = {"error": {"code": "not_found", "message": "job 9: no record of it"}}
    stub.answer("GET", "/v1/jobs/9/goodput", 404, error)
    result = run(stub, "--job", "9")
    assert result.exit_code == 1
    assert result.output == "hyperpod: error: job 9: no record of it (HTTP 404, not_found)\n"


DETAIL = {
    "job_id": 7, "state": "RUNNING", "nodes": ["n1", "n3"], "restart_count": 0, "cap": 3,
    "attempts": 0, "last_cause": "", "tracking": "step-retry", "last_requeue_at": None,
    "resumed_from_step": None, "events": [], "actions": [],
}  # fmt: skip


def test_jobs_show_ends_with_the_goodput_block(stub: Stub) -> None:
    stub.answer("GET", "/v1/jobs/7", 200, {**DETAIL, "goodput": ONE})
    result = CliRunner().invoke(jobs, ["show", "7", "--config", str(stub.config)])
    assert result.exit_code == 0, result.output
    head, block = result.output.split("\n\nGoodput:\n")
    assert "tracking:" in head and block.startswith("job:         7\n")
    assert "ETTR:        0.997" in block and "Incidents:" in block


def test_jobs_show_from_a_controller_without_goodput(stub: Stub) -> None:
    stub.answer("GET", "/v1/jobs/7", 200, DETAIL)
    result = CliRunner().invoke(jobs, ["show", "7", "--config", str(stub.config)])
    assert result.exit_code == 0 and "Goodput" not in result.output


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "unknown"), (True, "unknown"), (0, "0.0s"), (59.94, "59.9s"), (60, "1m00s"),
     (1000, "16m40s"), (7500, "2h05m"), (3 * 86400 + 4 * 3600 + 59, "3d04h")],
)  # fmt: skip
def test_durations(seconds: Any, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"seconds": 12, "complete": True}, "12.0s"),
        ({"seconds": 12, "complete": False}, ">=12.0s"),
        ({"seconds": None, "complete": False}, "unknown"),
        (None, "unknown"),
        ({"seconds": 1}, "1.0s"),
    ],
)
def test_lost_cells(value: Any, text: str) -> None:
    assert lost(value) == text
