"""Every refused request is answered in the documented form, counted by cause and
logged, at most once a minute per cause and caller."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_api import Api, error_of, now_iso, report

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.api.models import ERROR_CODES
from hyperpod_agent.controller.api.rejections import Rejections

LOGGER = "hyperpod_agent.controller.api.rejections"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def api(tmp_path: Path, clock: Clock) -> Iterator[Api]:
    a = Api(tmp_path, rejections=Rejections(clock=clock))
    a.controller.reconcile_once()
    yield a
    a.client.close()


def counted(code: str) -> float:
    return metrics.REGISTRY.get_sample_value("hyperpod_api_rejections_total", {"code": code}) or 0


def reports_counted(code: str) -> float:
    labels = {"kind": "request", "outcome": code}
    return metrics.REGISTRY.get_sample_value("hyperpod_reports_total", labels) or 0


def refused(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = error_of(resp)
    assert err["code"] == code and ERROR_CODES[code] == status
    return err


def beat(seq: int, node: str = "node2") -> dict[str, Any]:
    return {"node": node, "agent_id": "a", "seq": seq, "sent_at": now_iso()}


# (what, request, status, code): one request of each kind of refusal.
CASES: list[tuple[str, Any, int, str]] = [
    ("no credential", lambda a: a.post("/v1/reports", report(), who=None), 401, "unauthenticated"),
    ("node1 for node2", lambda a: a.post("/v1/reports", report(), who="node1"), 403, "forbidden"),
    (
        "agent asks for an admin action",
        lambda a: a.post("/v1/nodes/node1/actions", {"action": "reboot"}, who="node1"),
        403,
        "forbidden",
    ),
    ("unknown path", lambda a: a.get("/v1/nope"), 404, "not_found"),
    ("wrong method", lambda a: a.client.delete("/v1/healthz"), 405, "method_not_allowed"),
    ("too large", lambda a: a.post("/v1/reports", None, raw=b" " * 300_000), 413, "too_large"),
    ("bad field", lambda a: a.post("/v1/heartbeats", {**beat(1), "seq": "x"}), 422, "invalid"),
    ("not JSON", lambda a: a.post("/v1/heartbeats", None, raw=b"{no"), 400, "malformed_json"),
    (
        "deeply nested",
        lambda a: a.post("/v1/heartbeats", None, raw=b"[" * 50_000 + b"]" * 50_000),
        400,
        "malformed_json",
    ),
    (
        "NaN in the body",
        lambda a: a.post(
            "/v1/heartbeats", None, raw=json.dumps(beat(1)).replace("1,", "NaN,", 1).encode()
        ),
        400,
        "malformed_json",
    ),
    (
        "a number too long to parse",
        lambda a: a.post("/v1/heartbeats", None, raw=b'{"seq": ' + b"9" * 5000 + b"}"),
        400,
        "malformed_json",
    ),
    (
        "wrong content type",
        lambda a: a.post("/v1/heartbeats", beat(1), extra={"content-type": "text/plain"}),
        415,
        "unsupported_media_type",
    ),
    (
        "many headers",
        lambda a: a.client.get("/v1/status", headers={f"x-h{i}": "v" * 100 for i in range(200)}),
        431,
        "headers_too_large",
    ),
    (
        "bad content length",
        lambda a: a.post("/v1/heartbeats", None, raw=b"{}", extra={"content-length": "abc"}),
        400,
        "bad_request",
    ),
]


@pytest.mark.parametrize(("what", "send", "status", "code"), CASES, ids=[c[0] for c in CASES])
def test_each_refusal_is_answered_counted_and_logged(
    api: Api, caplog: pytest.LogCaptureFixture, what: str, send: Any, status: int, code: str
) -> None:
    before, before_reports = counted(code), reports_counted(code)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        refused(send(api), status, code)
    assert counted(code) == before + 1, what
    assert reports_counted(code) == before_reports + 1, what
    [line] = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert f": {status} {code}: " in line
    assert api.store.node_rows() == {} and api.store.open_faults() == []


def test_replayed_and_stale_reports_are_counted(api: Api) -> None:
    assert api.post("/v1/heartbeats", beat(5)).status_code == 200
    before = counted("replayed")
    refused(api.post("/v1/heartbeats", beat(5)), 409, "replayed")
    assert counted("replayed") == before + 1


def test_an_identity_flooding_past_its_share_gets_429(tmp_path: Path) -> None:
    api = Api(tmp_path, auth={"replay_cache_size": 64, "replay_cache_per_identity": 16})
    statuses = [api.get("/v1/status", who="node1").status_code for _ in range(20)]
    assert statuses == [200] * 16 + [429] * 4
    before = counted("rate_limited")
    refused(api.get("/v1/status", who="node1"), 429, "rate_limited")
    assert counted("rate_limited") == before + 1
    assert api.get("/v1/status", who="node2").status_code == 200
    api.client.close()


def test_logging_is_rate_limited_per_cause_and_caller(
    api: Api, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    before = counted("forbidden")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(11):
            refused(api.post("/v1/reports", report(), who="node1"), 403, "forbidden")
        # Another caller, the same cause: its own first line.
        refused(api.post("/v1/reports", report("node1"), who="node3"), 403, "forbidden")
        # Another cause, the same caller: its own first line too.
        refused(api.get("/v1/nope", who="node1"), 404, "not_found")
    assert counted("forbidden") == before + 12
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 3, lines
    assert "token of node node1" in lines[0] and "may not report for node node2" in lines[0]
    assert "token of node node3" in lines[1] and "/v1/nope" in lines[2]
    caplog.clear()
    clock.now += 61
    with caplog.at_level(logging.INFO, logger=LOGGER):
        refused(api.post("/v1/reports", report(), who="node1"), 403, "forbidden")
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    summary = [line for line in lines if "held back" in line]
    assert len(summary) == 1 and "10 more 403 forbidden" in summary[0], lines
    assert "token of node node1" in summary[0]
    assert len(lines) == 2  # the summary, then this minute's first refusal


def test_a_summary_is_written_when_the_minute_ends_without_more_refusals(
    api: Api, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            api.post("/v1/reports", report(), who="node1")
        clock.now += 61
        assert api.get("/v1/status").status_code == 200  # any request flushes due summaries
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 2 and "2 more 403 forbidden" in lines[1]


def test_logged_lines_are_one_line_and_bounded(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        api.client.get("/v1/" + "%0A%1B" * 400)
    [line] = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "\n" not in line and "\x1b" not in line and len(line) < 600


def test_callers_beyond_the_tracked_limit_share_one_line(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    rejections = Rejections(clock=clock, max_callers=4)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for i in range(10):
            rejections.record(401, "unauthenticated", "no", f"10.0.0.{i}", "GET", "/v1/status")
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 5 and "other callers" in lines[-1]
