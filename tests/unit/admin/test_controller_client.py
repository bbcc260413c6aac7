"""ControllerClient: typed, one-line errors over real loopback HTTP."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pytest

from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.client import (
    ControllerClient,
    ControllerError,
    ControllerUnreachable,
    check_url,
)
from hyperpod_agent.errors import ConfigError

if TYPE_CHECKING:
    from conftest import Stub


def client(stub: Stub, timeout: float = 5.0, node: str | None = None) -> ControllerClient:
    auth = ClientAuth(AuthConfig(mode="token", token_secret_file=stub.secret), node)
    return ControllerClient(stub.url + "/", auth, timeout)


def test_json_answer_and_identity(stub: Stub) -> None:
    stub.answer("GET", "/v1/healthz", 200, {"ok": True})
    assert client(stub).healthz() == {"ok": True}
    assert stub.seen[0].identity.is_admin


def test_node_client_reports_as_its_node(stub: Stub) -> None:
    stub.answer("POST", "/v1/heartbeats", 200, {"accepted": True})
    c = client(stub, node="node4")
    assert c.heartbeat("node4", "a", 3, "2026-11-22T00:00:00+00:00") == {"accepted": True}
    assert stub.seen[0].identity.node == "node4"
    assert stub.seen[0].body == {
        "node": "node4",
        "agent_id": "a",
        "seq": 3,
        "sent_at": "2026-11-22T00:00:00+00:00",
    }


def test_path_segments_are_escaped(stub: Stub) -> None:
    with pytest.raises(ControllerError, match="no route /v1/nodes/a%2Fb"):
        client(stub).node("a/b")


def test_error_message_comes_from_the_json_body(stub: Stub) -> None:
    stub.answer("GET", "/v1/status", 409, {"error": {"code": "busy", "message": "try later"}})
    with pytest.raises(ControllerError) as info:
        client(stub).status()
    assert str(info.value) == "try later (HTTP 409, busy)"
    assert (info.value.status, info.value.code, info.value.detail) == (409, "busy", "try later")
    assert not info.value.retryable


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(500, True), (503, True), (429, True), (400, False), (401, False), (404, False)],
)
def test_retryable_statuses(stub: Stub, status: int, retryable: bool) -> None:
    stub.answer("GET", "/v1/status", status, {"error": {"code": "x", "message": "y"}})
    with pytest.raises(ControllerError) as info:
        client(stub).status()
    assert info.value.retryable is retryable


def test_non_json_error_body(stub: Stub) -> None:
    stub.answer("GET", "/v1/status", 502, b"<html>Bad Gateway</html>\nmore")
    with pytest.raises(
        ControllerError,
        match=r"^controller said: <html>Bad Gateway</html> "
        r"\(HTTP 502, http_error\)$",
    ):
        client(stub).status()


def test_invalid_json_answer(stub: Stub) -> None:
    stub.answer("GET", "/v1/status", 200, b"{not json")
    with pytest.raises(ControllerError, match="controller sent invalid JSON"):
        client(stub).status()


def test_timeout_is_unreachable(stub: Stub) -> None:
    stub.gate = threading.Event()
    stub.answer("GET", "/v1/status", 200, {})
    with pytest.raises(ControllerUnreachable, match=r"unreachable: timed out"):
        client(stub, timeout=0.3).status()
    stub.gate.set()


def test_refused_connection_is_unreachable() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    c = ControllerClient(f"http://127.0.0.1:{port}", ClientAuth(AuthConfig(mode="none")))
    with pytest.raises(ControllerUnreachable) as info:
        c.status()
    assert (
        str(info.value) == f"controller at http://127.0.0.1:{port} unreachable: Connection refused"
    )


def test_unknown_host_is_unreachable() -> None:
    c = ControllerClient("http://no-such-host.invalid:1", ClientAuth(AuthConfig(mode="none")))
    with pytest.raises(ControllerUnreachable, match="no-such-host.invalid:1 unreachable: "):
        c.status()


def test_events_query(stub: Stub) -> None:
    stub.answer("GET", "/v1/events", 200, [])
    client(stub).events(since="2026-11-22T00:00:00+00:00", node="node1", limit=3)
    assert stub.seen[0].path == (
        "/v1/events?since=2026-11-22T00%3A00%3A00%2B00%3A00&node=node1&limit=3"
    )


def test_unknown_action_is_a_bug() -> None:
    c = ControllerClient("http://127.0.0.1:1", ClientAuth(AuthConfig(mode="none")))
    with pytest.raises(ValueError, match="unknown action 'explode'"):
        c.action("node1", "explode")


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://h", "http://", "http://h/?x=1"])
def test_bad_url(url: str) -> None:
    with pytest.raises(ConfigError, match="controller URL"):
        check_url(url)


def test_url_with_a_prefix(stub: Stub) -> None:
    auth = ClientAuth(AuthConfig(mode="token", token_secret_file=stub.secret))
    c = ControllerClient(stub.url + "/hp", auth)
    with pytest.raises(ControllerError, match="no route /hp/v1/status"):
        c.status()


def test_step_retry_asks_the_first_controller_that_answers(stub: Stub) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    auth = ClientAuth(AuthConfig(mode="token", token_secret_file=stub.secret), "node1")
    c = ControllerClient([dead, stub.url], auth, 5.0)
    stub.answer("POST", "/v1/steps/retry", 202, {"id": 4, "decision": "RETRYSTEP"})
    stub.answer("GET", "/v1/steps/retry/4", 200, {"id": 4, "done": True})
    assert c.step_retry(12, "0", 1, "node[1-3]", 1, 3) == {"id": 4, "decision": "RETRYSTEP"}
    assert c.step_retry_state(4) == {"id": 4, "done": True}
    assert c.url == stub.url
    assert stub.seen[0].body == {
        "job_id": 12,
        "step_id": "0",
        "exit_code": 1,
        "nodelist": "node[1-3]",
        "attempt": 1,
        "auto_resume": 3,
        "cancelled": False,
    }
