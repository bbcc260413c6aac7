"""Hostile input against a real controller process with real MUNGE credentials.

A real munged and a real ``hyperpod controller run`` (its own state, a free loopback
port, no Slurm: its slurm_conf is an empty file, so every pass fails at once and only
logs it). Every hostile request must get a 4xx in the documented form, change no
state the admin API shows, be counted, leave a bounded log, and leave the controller
answering as fast as before.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from munge_helpers import encode_as_nobody, start_munged, stop_daemon

from hyperpod_agent.auth import munge as _munge
from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.auth.tokens import body_digest

pytestmark = pytest.mark.root

TIMEOUT_S = 10.0
PER_IDENTITY = 400  # the controller's replay_cache_per_identity in this test
SAMPLES = 40  # latency samples before and after


@dataclass
class Controller:
    port: int
    sock: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def auth(self, method: str, path: str, body: bytes, node: str | None = None) -> str:
        return ClientAuth(AuthConfig(munge_socket=self.sock), node).headers(method, path, body)[
            "Authorization"
        ]

    def payload_cred(self, path: str, body: bytes, tail: str = "", **claims: Any) -> str:
        """A root credential around a payload of our choosing; ``tail`` is raw JSON
        text put before its closing brace (for what json.dumps cannot write)."""
        text = json.dumps({**_claims("GET", path, body, None), **claims})
        return "MUNGE " + _munge.encode((text[:-1] + tail + "}").encode(), self.sock)

    def as_user(self, path: str, body: bytes, node: str | None = None) -> str:
        """A POST credential made by an unprivileged user (uid 65534)."""
        return "MUNGE " + encode_as_nobody(self.sock, json.dumps(_claims("POST", path, body, node)))

    def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        auth: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        sent = {"Content-Type": "application/json", **(headers or {})}
        if auth is not None:
            sent["Authorization"] = auth
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT_S)
        try:
            conn.request(method, path, body=body or None, headers=sent)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
        finally:
            conn.close()

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        data = b"" if body is None else json.dumps(body).encode()
        status, answer = self.send(method, path, data, self.auth(method, path, data))
        assert status < 300, (method, path, status, answer)
        return answer

    def raw(self, request: bytes) -> tuple[int, Any]:
        """Send bytes as they are; read the answer until the controller closes."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT_S) as conn:
            conn.sendall(request)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), json.loads(body)


def _claims(method: str, path: str, body: bytes, node: str | None) -> dict[str, Any]:
    return {"v": 1, "m": method, "p": path, "b": body_digest(body), "t": time.time(), "n": node}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def controller() -> Iterator[Controller]:
    # Not under pytest's 0700 tmp: an unprivileged client must reach munged's socket.
    base = Path(tempfile.mkdtemp(prefix="hp-hostile-", dir="/tmp"))
    base.chmod(0o755)
    munged: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    try:
        sock, munged = start_munged(base, "munge")
        (base / "slurm.conf").write_text("")  # sinfo fails at once: no cluster needed
        port = _free_port()
        config = base / "controller.toml"
        config.write_text(
            f"listen_port = {port}\n"
            f'state_db = "{base / "state.db"}"\n'
            f'slurm_conf = "{base / "slurm.conf"}"\n'
            "reconcile_interval_s = 30\n"
            "[auth]\n"
            'mode = "munge"\n'
            f'munge_socket = "{sock}"\n'
            "check_origin = false\n"  # no Slurm, so no node addresses to check against
            f"replay_cache_per_identity = {PER_IDENTITY}\n"
        )
        log = base / "controller.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "hyperpod_agent.controller.cli",
                    "run",
                    "--config",
                    str(config),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        made = Controller(port, sock, log, proc)
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                if made.send("GET", "/v1/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "controller did not answer within 30 s"
            time.sleep(0.1)
        yield made
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if munged is not None:
            stop_daemon(munged)
        shutil.rmtree(base, ignore_errors=True)


def _report(node: str, seq: int, **over: Any) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    body = {
        "node": node,
        "agent_id": "hostile-test",
        "seq": seq,
        "generated_at": now,
        "verdict": "healthy",
        "results": [{"probe": "gpu", "status": "OK", "findings": [], "at": now}],
    }
    return {**body, **over}


def _state(c: Controller) -> Any:
    """What the admin API shows of the controller's state."""
    status = c.admin("GET", "/v1/status")
    return (
        c.admin("GET", "/v1/nodes"),
        c.admin("GET", "/v1/nodes/node1"),
        c.admin("GET", "/v1/events?limit=1000"),
        c.admin("GET", "/v1/jobs"),
        {k: status[k] for k in ("nodes_total", "open_faults", "pending_actions", "by_verdict")},
    )


def _p50(c: Controller) -> float:
    """Median round trip of a cheap authenticated GET (credential made beforehand)."""
    times = []
    for _ in range(SAMPLES):
        auth = c.auth("GET", "/v1/status", b"")
        start = time.perf_counter()
        status, _ = c.send("GET", "/v1/status", auth=auth)
        times.append(time.perf_counter() - start)
        assert status == 200
    return statistics.median(times)


def _rejections(c: Controller) -> dict[str, float]:
    text = _metrics(c)
    found = re.findall(r'^hyperpod_api_rejections_total\{code="([a-z_]+)"\} (\S+)$', text, re.M)
    return {code: float(value) for code, value in found}


def _metrics(c: Controller) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


Answers = list[tuple[str, int, Any]]  # (what was sent, status, answer)


def _bad_credentials(c: Controller, out: Answers) -> None:
    out.append(("no credential (read)", *c.send("GET", "/v1/status")))
    report = json.dumps(_report("node2", 1)).encode()
    out.append(("no credential (report)", *c.send("POST", "/v1/reports", report)))
    for value in [
        "MUNGE",
        "MUNGE ",
        "MUNGE garbage",
        "MUNGE MUNGE:AAAA:",
        "MUNGE MUNGE:" + "A" * 2000 + ":",
        "Bearer abc",
        "HPTOKEN role=admin ts=1 nonce=ab sig=cd",
        "MUNGE " + "\u00e9" * 64,  # non-ASCII (latin-1 on the wire)
        "MUNGE MUNGE:\u00ff\u00fe:",
        "NONE node=node1",
    ]:
        out.append((f"malformed {value[:24]!r}", *c.send("GET", "/v1/status", auth=value)))
    once = c.auth("GET", "/v1/status", b"")
    assert c.send("GET", "/v1/status", auth=once)[0] == 200
    out.append(("replayed", *c.send("GET", "/v1/status", auth=once)))
    for what, stamp in [
        ("future-stamped", time.time() + 3600),
        ("past-stamped", time.time() - 3600),
        ("NaN-stamped", float("nan")),
        ("infinity-stamped", float("inf")),
        ("absurd stamp", 1e300),
        ("huge integer stamp", 10**40),
        ("string stamp", "now"),
    ]:
        cred = c.payload_cred("/v1/status", b"", t=stamp)
        out.append((what, *c.send("GET", "/v1/status", auth=cred)))
    for what, cred in [
        (
            "nested payload",
            c.payload_cred("/v1/status", b"", tail=', "x": ' + "[" * 3000 + "]" * 3000),
        ),
        ("payload version true", c.payload_cred("/v1/status", b"", v=True)),
        ("credential for another path", c.auth("GET", "/v1/nodes", b"")),
    ]:
        out.append((what, *c.send("GET", "/v1/status", auth=cred)))
    tampered = report.replace(b"healthy", b"faulty!")
    cred = c.auth("POST", "/v1/reports", report, node="node2")
    out.append(("tampered body", *c.send("POST", "/v1/reports", tampered, auth=cred)))


def _wrong_identities(c: Controller, out: Answers) -> None:
    report = json.dumps(_report("node2", 1)).encode()
    beat = b'{"node": "node2", "agent_id": "x", "seq": 1, "sent_at": "2030-01-01T00:00:00Z"}'
    action = b'{"action": "reboot", "reason": "x"}'
    actions = "/v1/nodes/node1/actions"
    for what, path, body, cred in [
        (
            "node1 reports for node2",
            "/v1/reports",
            report,
            c.auth("POST", "/v1/reports", report, "node1"),
        ),
        (
            "node1 beats for node2",
            "/v1/heartbeats",
            beat,
            c.auth("POST", "/v1/heartbeats", beat, "node1"),
        ),
        (
            "an agent asks for a node action",
            actions,
            action,
            c.auth("POST", actions, action, "node1"),
        ),
        (
            "an admin reports a node's state",
            "/v1/reports",
            report,
            c.auth("POST", "/v1/reports", report),
        ),
        ("a user claims a node", "/v1/reports", report, c.as_user("/v1/reports", report, "node2")),
        ("a user asks for a node action", actions, action, c.as_user(actions, action)),
        (
            "a user reports job ends",
            "/v1/jobs/7/ended",
            b"{}",
            c.as_user("/v1/jobs/7/ended", b"{}"),
        ),
    ]:
        out.append((what, *c.send("POST", path, body, auth=cred)))


def _bad_bodies(c: Controller, out: Answers) -> None:
    """Bodies from an authenticated node: malformed, nested, huge numbers, wrong types."""
    good = json.dumps(_report("node2", 2))
    for what, body, content_type in [
        ("not JSON", b"{not json", "application/json"),
        ("deeply nested JSON", b"[" * 100_000 + b"]" * 100_000, "application/json"),
        ("deeply nested object", b'{"a":' * 20_000 + b"1" + b"}" * 20_000, "application/json"),
        ("a number too long", good.replace('"seq": 2', '"seq": ' + "9" * 5000).encode(), ""),
        ("seq 1e400", good.replace('"seq": 2', '"seq": 1e400').encode(), "application/json"),
        ("seq NaN", good.replace('"seq": 2', '"seq": NaN').encode(), "application/json"),
        ("seq 2**64", json.dumps(_report("node2", 2**64)).encode(), "application/json"),
        ("negative seq", json.dumps(_report("node2", -1)).encode(), "application/json"),
        ("generated_at 1e300", json.dumps(_report("node2", 2, generated_at=1e300)).encode(), ""),
        ("a list", b"[]", "application/json"),
        ("text/plain", good.encode(), "text/plain"),
        ("form data", b"node=node2&seq=2", "application/x-www-form-urlencoded"),
        ("invalid UTF-8", b'{"node": "\xff\xfe"}', "application/json"),
        ("oversized body", b" " * 1_000_000, "application/json"),
    ]:
        cred = c.auth("POST", "/v1/reports", body, node="node2")
        sent = c.send("POST", "/v1/reports", body, cred, {"Content-Type": content_type})
        out.append((what, *sent))


def _bad_requests(c: Controller, out: Answers) -> None:
    """Oversized headers and bodies, broken HTTP: raw bytes on a socket."""
    head = b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    chunked = b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
    get = b"GET /v1/status HTTP/1.1\r\nHost: x\r\n"
    for what, request in [
        ("oversized headers", get + b"X-Big: " + b"a" * 200_000 + b"\r\n\r\n"),
        ("many headers", get + b"X-A: b\r\n" * 5000 + b"\r\n"),
        ("oversized chunked body", head + chunked + chunk * 8 + b"0\r\n\r\n"),
        ("a lying Content-Length", head + b"Content-Length: abc\r\n\r\n{}"),
        ("a negative Content-Length", head + b"Content-Length: -5\r\n\r\n{}"),
        ("not HTTP", b"HELLO\r\n\r\n"),
        ("a NUL in the request line", b"GET /v1/st\x00atus HTTP/1.1\r\nHost: x\r\n\r\n"),
    ]:
        out.append((what, *c.raw(request)))
    action = b'{"action": "reboot", "reason": "x"}'
    for what, method, path, body in [
        ("unknown path", "GET", "/v1/nope", b""),
        ("path traversal", "GET", "/v1/nodes/..%2F..%2Fetc%2Fpasswd", b""),
        ("wrong method", "DELETE", "/v1/status", b""),
        ("huge job id", "GET", f"/v1/jobs/{2**80}", b""),
        ("huge event id", "GET", f"/v1/events?since={10**30}", b""),
        ("action on an unknown node", "POST", "/v1/nodes/ghost/actions", action),
    ]:
        out.append((what, *c.send(method, path, body, c.auth(method, path, body))))


def _flood(c: Controller, out: Answers) -> None:
    """One identity flooding, stamped at the edge of the allowed skew: 429 past its share."""
    for i in range(PER_IDENTITY + 10):
        cred = c.payload_cred("/v1/status", b"", t=time.time() + 55, n="node9")
        status, answer = c.send("GET", "/v1/status", auth=cred)
        if i >= PER_IDENTITY:
            out.append((f"flood {i}", status, answer))
        else:
            assert status == 200, (i, answer)


def _hostile(c: Controller) -> Answers:
    """Send every hostile request; return (what, status, answer) for each."""
    out: Answers = []
    for batch in (_bad_credentials, _wrong_identities, _bad_bodies, _bad_requests, _flood):
        batch(c, out)
    return out


def test_hostile_requests_are_refused_counted_and_change_nothing(controller: Controller) -> None:
    c = controller
    # An honest report first, so there is state to protect.
    body = json.dumps(_report("node1", 1)).encode()
    status, answer = c.send(
        "POST", "/v1/reports", body, c.auth("POST", "/v1/reports", body, "node1")
    )
    assert status == 200, answer
    before = _state(c)
    counted_before = _rejections(c)
    p50_before = _p50(c)
    log_lines_before = len(c.log.read_text().splitlines())

    started = time.monotonic()
    answers = _hostile(c)
    hostile_s = time.monotonic() - started

    for what, status, answer in answers:
        assert 400 <= status < 500, (what, status, answer)
        assert (
            set(answer) == {"error"} and answer["error"]["code"] and answer["error"]["message"]
        ), what
    codes = {what: answer["error"]["code"] for what, _, answer in answers}
    assert codes["replayed"] == codes["future-stamped"] == codes["NaN-stamped"] == "unauthenticated"
    assert (
        codes["node1 reports for node2"] == codes["an agent asks for a node action"] == "forbidden"
    )
    assert codes["an admin reports a node's state"] == codes["a user claims a node"] == "forbidden"
    assert codes["oversized headers"] == codes["many headers"] == "headers_too_large"
    assert codes["oversized body"] == codes["oversized chunked body"] == "too_large"
    assert codes["deeply nested JSON"] == codes["seq NaN"] == "malformed_json"
    assert codes["text/plain"] == "unsupported_media_type"
    assert codes[f"flood {PER_IDENTITY}"] == "rate_limited"

    # Nothing changed, and the honest callers are still let in.
    assert _state(c) == before
    assert c.proc.poll() is None
    body = json.dumps(_report("node1", 2)).encode()
    assert (
        c.send("POST", "/v1/reports", body, c.auth("POST", "/v1/reports", body, "node1"))[0] == 200
    )

    # Every refusal counted by its code.
    counted_after = _rejections(c)
    expected: dict[str, int] = {}
    for _, _, answer in answers:
        expected[answer["error"]["code"]] = expected.get(answer["error"]["code"], 0) + 1
    for code, n in expected.items():
        assert counted_after.get(code, 0) - counted_before.get(code, 0) == n, code

    # Logged, but not once per request.
    new_lines = c.log.read_text().splitlines()[log_lines_before:]
    refused_lines = [line for line in new_lines if "refused" in line or "held back" in line]
    assert refused_lines, "refusals were not logged"
    assert len(new_lines) <= 60, (len(answers), new_lines[-20:])

    # Still as quick as before (a generous bound: this is no benchmark).
    p50_after = _p50(c)
    print(
        f"hostile requests: {len(answers)} refused in {hostile_s:.2f} s; "
        f"p50 GET /v1/status before {p50_before * 1000:.2f} ms, after {p50_after * 1000:.2f} ms; "
        f"log lines added: {len(new_lines)}"
    )
    assert p50_after <= 5 * p50_before + 0.05
