"""The controller's real HTTP server (uvicorn on a loopback socket) answers what it
refuses, in the documented form, instead of resetting the connection."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_api import Api

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.api.guard import MAX_HEADER_BYTES
from hyperpod_agent.controller.api.server import make_server

TIMEOUT_S = 10.0


@pytest.fixture
def port(tmp_path: Path) -> Iterator[int]:
    api = Api(tmp_path)
    listener = socket.create_server(("127.0.0.1", 0))
    server = make_server(api.client.app, "127.0.0.1", listener.getsockname()[1])  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        for _ in range(200):  # bounded: 10 s
            if server.started:
                break
            threading.Event().wait(0.05)
        assert server.started, "uvicorn did not start"
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(TIMEOUT_S)
        listener.close()
        api.client.close()


def exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` whole, then read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):  # ConnectionResetError fails the test
            answer += chunk
    return answer


def parse(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


def counted(code: str) -> float:
    return metrics.REGISTRY.get_sample_value("hyperpod_api_rejections_total", {"code": code}) or 0


def test_oversized_headers_get_a_431_not_a_reset(port: int) -> None:
    before = counted("headers_too_large")
    big = b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
    status, body = parse(exchange(port, big))
    assert status == 431
    assert body["error"]["code"] == "headers_too_large"
    assert str(MAX_HEADER_BYTES) in body["error"]["message"]
    assert counted("headers_too_large") == before + 1
    healthz = b"GET /v1/healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    status, body = parse(exchange(port, healthz))
    assert status == 200 and body["ok"] is True


def test_headers_over_the_limit_in_one_read_get_a_431_too(port: int) -> None:
    # h11 only notices an oversized header block it has to wait for; one that
    # arrives whole is caught by the Guard.
    many = b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 5000 + b"\r\n"
    status, body = parse(exchange(port, many))  # the server closes: no keep-alive wait
    assert status == 431 and body["error"]["code"] == "headers_too_large"


def test_an_unparsable_request_gets_the_documented_400(port: int) -> None:
    before = counted("bad_request")
    status, body = parse(exchange(port, b"HELLO THERE\r\n\r\n"))
    assert status == 400 and body["error"]["code"] == "bad_request"
    assert counted("bad_request") == before + 1


def test_an_oversized_body_gets_a_413(port: int) -> None:
    head = b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    request = head + b"Content-Length: 1000000\r\nConnection: close\r\n\r\n" + b" " * 1_000_000
    status, body = parse(exchange(port, request))
    assert status == 413 and body["error"]["code"] == "too_large"


def test_a_flood_of_bad_requests_leaves_a_bounded_log(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        for _ in range(20):
            assert parse(exchange(port, b"HELLO\r\n\r\n"))[0] == 400
            upgrade = b"GET /v1/healthz HTTP/1.1\r\nHost: x\r\nConnection: upgrade, close\r\n"
            assert parse(exchange(port, upgrade + b"Upgrade: websocket\r\n\r\n"))[0] == 200
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) <= 4, [r.getMessage() for r in warnings]
