"""A controller that takes requests but never answers (a frozen leader) loses its
clients within one timeout for what may be asked twice, and never gets a second copy
of what changes something."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.client import ControllerClient, ControllerUnreachable

TIMEOUT_S = 0.5


class Frozen:
    """Accepts connections and reads requests, answers nothing (SIGSTOP-like)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.taken: list[bytes] = []
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self.sock.settimeout(0.1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(2.0)
            try:
                self.taken.append(conn.recv(65536).split(b"\r\n", 1)[0])
            except TimeoutError:
                pass
            self._held.append(conn)  # never answered, never closed until the end

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
        for c in self._held:
            c.close()
        self.sock.close()


class Answering:
    """A controller that answers every request with JSON naming itself."""

    def __init__(self) -> None:
        hits = self.hits = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                hits.append(f"{self.command} {self.path}")
                body = json.dumps({"ok": True, "controller": "b"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def pair() -> Iterator[tuple[Frozen, Answering, ControllerClient]]:
    frozen, answering = Frozen(), Answering()
    client = ControllerClient(
        [frozen.url, answering.url], ClientAuth(AuthConfig(mode="none")), timeout=TIMEOUT_S
    )
    yield frozen, answering, client
    frozen.close()
    answering.close()


def test_a_read_goes_to_the_other_controller_when_the_first_does_not_answer(
    pair: tuple[Frozen, Answering, ControllerClient],
) -> None:
    frozen, answering, client = pair
    assert client.status()["controller"] == "b"
    assert frozen.taken == [b"GET /v1/status HTTP/1.1"]  # the frozen one had it first
    assert answering.hits == ["GET /v1/status"]
    assert client.url == answering.url  # remembered: the next request goes there at once
    client.nodes()
    assert len(frozen.taken) == 1 and answering.hits[-1] == "GET /v1/nodes"


@pytest.mark.parametrize(
    "send",
    [
        lambda c: c.report({"node": "node1"}),
        lambda c: c.heartbeat("node1", "a", 1, "2026-01-01T00:00:00Z"),
        lambda c: c.step_watch(7, "0", 0, "node1"),
    ],
    ids=["report", "heartbeat", "watch"],
)
def test_reports_heartbeats_and_watches_fail_over_on_a_timeout(
    pair: tuple[Frozen, Answering, ControllerClient], send: object
) -> None:
    frozen, answering, client = pair
    send(client)  # type: ignore[operator]
    assert len(frozen.taken) == 1 and len(answering.hits) == 1


@pytest.mark.parametrize(
    "send",
    [
        lambda c: c.action("node1", "drain", "x"),
        lambda c: c.check(["node1"]),
        lambda c: c.step_retry(7, "0", 1, "node1", 0, 1),
        lambda c: c.job_ended(7, 0),
    ],
    ids=["action", "check", "step-retry", "job-ended"],
)
def test_a_request_that_changes_something_is_never_sent_twice(
    pair: tuple[Frozen, Answering, ControllerClient], send: object
) -> None:
    frozen, answering, client = pair
    with pytest.raises(ControllerUnreachable, match="timed out after 0.5 s"):
        send(client)  # type: ignore[operator]
    assert len(frozen.taken) == 1
    assert answering.hits == []
