"""A stub controller: a real HTTP server on loopback with canned answers.

It authenticates every request with a real ServerAuth in token mode, so the admin
commands are tested with the same credentials they use against a real controller.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.auth.config import AuthConfig, AuthError, Identity
from hyperpod_agent.auth.server import ServerAuth


@dataclass
class Seen:
    method: str
    path: str
    body: Any
    identity: Identity


@dataclass
class Stub:
    url: str
    config: Path  # an admin.toml pointing at the stub, with a working admin key
    secret: Path
    routes: dict[tuple[str, str], tuple[int, Any]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    gate: threading.Event | None = None

    def answer(self, method: str, path: str, status: int, body: Any) -> None:
        self.routes[(method, path)] = (status, body)


def _handler(stub: Stub, auth: ServerAuth) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
            if stub.gate is not None:
                stub.gate.wait(10)
            path = self.path.split("?", 1)[0]
            try:
                identity = auth.verify(self.command, path, dict(self.headers), raw)
            except AuthError as exc:
                code = "forbidden" if exc.status == 403 else "unauthenticated"
                self._reply(exc.status, {"error": {"code": code, "message": str(exc)}})
                return
            stub.seen.append(
                Seen(self.command, self.path, json.loads(raw) if raw else None, identity)
            )
            status, body = stub.routes.get(
                (self.command, path),
                (404, {"error": {"code": "not_found", "message": f"no route {path}"}}),
            )
            self._reply(status, body)

        def _reply(self, status: int, body: Any) -> None:
            out = body if isinstance(body, bytes) else json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting (timeout tests)

        do_GET = _serve  # noqa: N815 - http.server's naming
        do_POST = _serve  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stub]:
    for var in (
        "HYPERPOD_CONTROLLER_URL",
        "HYPERPOD_MUNGE_SOCKET",
        "HYPERPOD_ADMIN_CONFIG",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HYPERPOD_LOCAL_CLUSTER_DIR", str(tmp_path / "no-cluster"))
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(b"c" * 40)
    auth = ServerAuth(AuthConfig(mode="token", token_secret_file=secret))
    made = Stub(url="", config=tmp_path / "admin.toml", secret=secret)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(made, auth))
    made.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    made.config.write_text(
        f'[controller]\nurl = "{made.url}"\ntimeout_s = 5\n\n'
        f'[auth]\nmode = "token"\ntoken_secret_file = "{secret}"\n'
    )
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield made
    finally:
        if made.gate is not None:
            made.gate.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
