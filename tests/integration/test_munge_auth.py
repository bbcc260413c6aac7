"""MUNGE mode against a real munged started by this module (needs root)."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from munge_helpers import NOBODY, encode_as_nobody, start_munged, stop_daemon

from hyperpod_agent.admin.cli import status
from hyperpod_agent.auth import munge as _munge
from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig, AuthError, Identity
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.auth.tokens import body_digest

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def mungeds() -> Iterator[tuple[Path, Path]]:
    """Two munged daemons with different keys; always stopped by pid."""
    assert shutil.which("munged") is not None and _munge.available(), (
        "munge is not installed: run scripts/setup.sh"
    )
    # Not under pytest's 0700 tmp: an unprivileged client must reach the socket.
    base = Path(tempfile.mkdtemp(prefix="hp-munge-", dir="/tmp"))
    base.chmod(0o755)
    pids: list[int] = []
    try:
        sock, pid = start_munged(base, "a")
        pids.append(pid)
        other, pid = start_munged(base, "b")
        pids.append(pid)
        yield sock, other
    finally:
        for pid in pids:
            stop_daemon(pid)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def sock(mungeds: tuple[Path, Path]) -> Path:
    return mungeds[0]


def _payload(method: str, path: str, body: bytes, node: str | None, at: float) -> str:
    claims = {"v": 1, "m": method, "p": path, "b": body_digest(body), "t": at, "n": node}
    return json.dumps(claims)


def test_root_admin_request(sock: Path) -> None:
    server = ServerAuth(AuthConfig(munge_socket=sock))
    headers = ClientAuth(AuthConfig(munge_socket=sock)).headers("GET", "/v1/nodes", b"")
    assert headers["Authorization"].startswith("MUNGE MUNGE:")
    ident = server.verify("GET", "/v1/nodes", headers, b"")
    assert (ident.uid, ident.gid, ident.node, ident.is_admin) == (0, 0, None, True)
    assert ident.method == "munge"


def test_root_agent_speaks_for_its_node(sock: Path) -> None:
    server = ServerAuth(AuthConfig(munge_socket=sock), node_address=lambda n: "127.0.0.1")
    body = b'{"node": "node2"}'
    headers = ClientAuth(AuthConfig(munge_socket=sock), "node2").headers(
        "POST", "/v1/reports", body
    )
    ident = server.verify("POST", "/v1/reports", headers, body)
    # Scoped to its node: an agent's credential is never an admin's.
    assert (ident.uid, ident.node, ident.is_admin) == (0, "node2", False)


def test_node_claim_from_the_wrong_address_is_forbidden(sock: Path) -> None:
    server = ServerAuth(AuthConfig(munge_socket=sock), node_address=lambda n: "10.9.8.7")
    headers = ClientAuth(AuthConfig(munge_socket=sock), "node2").headers("POST", "/v1/reports", b"")
    with pytest.raises(AuthError, match="comes from 127.0.0.1, not from 10.9.8.7") as info:
        server.verify("POST", "/v1/reports", headers, b"")
    assert info.value.status == 403


def test_node_claim_for_an_unknown_node_is_forbidden(sock: Path) -> None:
    server = ServerAuth(AuthConfig(munge_socket=sock), node_address=lambda n: None)
    headers = ClientAuth(AuthConfig(munge_socket=sock), "ghost").headers("POST", "/v1/reports", b"")
    with pytest.raises(AuthError, match="unknown node ghost") as info:
        server.verify("POST", "/v1/reports", headers, b"")
    assert info.value.status == 403


def test_origin_check_can_be_turned_off(sock: Path) -> None:
    config = AuthConfig(munge_socket=sock, check_origin=False)
    server = ServerAuth(config, node_address=lambda n: "10.9.8.7")
    headers = ClientAuth(config, "node2").headers("POST", "/v1/reports", b"")
    assert server.verify("POST", "/v1/reports", headers, b"").node == "node2"


def test_unprivileged_user_is_not_admin(sock: Path) -> None:
    server = ServerAuth(AuthConfig(munge_socket=sock))
    cred = encode_as_nobody(sock, _payload("GET", "/v1/nodes", b"", None, time.time()))
    ident = server.verify("GET", "/v1/nodes", {"Authorization": "MUNGE " + cred}, b"")
    assert (ident.uid, ident.gid, ident.is_admin, ident.node) == (NOBODY, NOBODY, False, None)


def test_admin_group_makes_an_admin(sock: Path) -> None:
    server = ServerAuth(AuthConfig(munge_socket=sock, admin_group=str(NOBODY)))
    cred = encode_as_nobody(sock, _payload("GET", "/v1/nodes", b"", None, time.time()))
    assert server.verify("GET", "/v1/nodes", {"Authorization": "MUNGE " + cred}, b"").is_admin


def test_unprivileged_user_cannot_speak_for_a_node(sock: Path) -> None:
    server = ServerAuth(AuthConfig(munge_socket=sock))
    cred = encode_as_nobody(sock, _payload("POST", "/v1/reports", b"", "node1", time.time()))
    with pytest.raises(AuthError, match="uid 65534 may not speak for node node1") as info:
        server.verify("POST", "/v1/reports", {"Authorization": "MUNGE " + cred}, b"")
    assert info.value.status == 403


def test_replay_is_refused(sock: Path) -> None:
    server = ServerAuth(AuthConfig(munge_socket=sock))
    headers = ClientAuth(AuthConfig(munge_socket=sock)).headers("GET", "/v1/status", b"")
    server.verify("GET", "/v1/status", headers, b"")
    with pytest.raises(AuthError, match="^replayed credential$"):
        server.verify("GET", "/v1/status", headers, b"")
    # A second controller sharing the munged: munged itself refuses the replay.
    with pytest.raises(AuthError, match="MUNGE credential rejected: Replayed credential"):
        ServerAuth(AuthConfig(munge_socket=sock)).verify("GET", "/v1/status", headers, b"")


@pytest.mark.parametrize(
    ("method", "path", "body", "message"),
    [
        ("POST", "/v1/status", b"", "made for 'GET', not POST"),
        ("GET", "/v1/nodes", b"", "made for another path, not /v1/nodes"),
        ("GET", "/v1/status", b"x", "does not match the request body"),
    ],
)
def test_credential_is_bound_to_the_request(
    sock: Path, method: str, path: str, body: bytes, message: str
) -> None:
    server = ServerAuth(AuthConfig(munge_socket=sock))
    headers = ClientAuth(AuthConfig(munge_socket=sock)).headers("GET", "/v1/status", b"")
    with pytest.raises(AuthError, match=message) as info:
        server.verify(method, path, headers, body)
    assert info.value.status == 401


def test_stale_timestamp_is_refused(sock: Path) -> None:
    server = ServerAuth(AuthConfig(munge_socket=sock, max_skew_s=30))
    client = ClientAuth(AuthConfig(munge_socket=sock), clock=lambda: time.time() - 120)
    with pytest.raises(AuthError, match=r"stale credential: timestamp is -1\d\d s off"):
        server.verify("GET", "/v1/status", client.headers("GET", "/v1/status", b""), b"")


def test_credential_from_another_key_is_refused(mungeds: tuple[Path, Path]) -> None:
    sock, other = mungeds
    headers = ClientAuth(AuthConfig(munge_socket=other)).headers("GET", "/v1/status", b"")
    with pytest.raises(AuthError, match="MUNGE credential rejected") as info:
        ServerAuth(AuthConfig(munge_socket=sock)).verify("GET", "/v1/status", headers, b"")
    assert info.value.status == 401


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("hello", "not a request binding"),
        ('{"v": 2}', "not a request binding"),
        ('{"v": 1, "m": "GET", "p": "/v1/status", "b": "' + body_digest(b"") + '"}', "timestamp"),
    ],
)
def test_foreign_payload_is_refused(sock: Path, payload: str, message: str) -> None:
    cred = _munge.encode(payload.encode(), sock)
    with pytest.raises(AuthError, match=message):
        ServerAuth(AuthConfig(munge_socket=sock)).verify(
            "GET", "/v1/status", {"Authorization": "MUNGE " + cred}, b""
        )


def test_garbage_credential_is_401(sock: Path) -> None:
    with pytest.raises(AuthError, match="MUNGE credential rejected") as info:
        ServerAuth(AuthConfig(munge_socket=sock)).verify(
            "GET", "/v1/status", {"Authorization": "MUNGE MUNGE:AAAA:"}, b""
        )
    assert info.value.status == 401


class _Verifying(BaseHTTPRequestHandler):
    """Answers GET /v1/status after verifying the caller with MUNGE."""

    server_auth: ServerAuth
    identities: list[Identity]

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        try:
            ident = self.server_auth.verify("GET", self.path, dict(self.headers), b"")
            self.identities.append(ident)
            status, body = 200, {"nodes_total": 1, "by_state": {}, "by_verdict": {}}
        except AuthError as exc:
            status, body = exc.status, {"error": {"code": "auth", "message": str(exc)}}
        out = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def munge_server(sock: Path) -> Iterator[tuple[str, list[Identity]]]:
    identities: list[Identity] = []
    handler = type(
        "Handler",
        (_Verifying,),
        {"server_auth": ServerAuth(AuthConfig(munge_socket=sock)), "identities": identities},
    )
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", identities
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_admin_cli_proves_identity_with_munge(
    sock: Path, munge_server: tuple[str, list[Identity]], tmp_path: Path
) -> None:
    url, identities = munge_server
    env = {"HYPERPOD_LOCAL_CLUSTER_DIR": str(tmp_path), "HYPERPOD_ADMIN_CONFIG": ""}
    result = CliRunner().invoke(
        status, ["--url", url, "--munge-socket", str(sock), "--json"], env=env
    )
    assert result.exit_code == 0, result.output
    assert identities[0].uid == 0 and identities[0].is_admin and identities[0].method == "munge"


def test_admin_cli_with_a_credential_the_controller_cannot_check(
    mungeds: tuple[Path, Path], munge_server: tuple[str, list[Identity]], tmp_path: Path
) -> None:
    url, _ = munge_server
    env = {"HYPERPOD_LOCAL_CLUSTER_DIR": str(tmp_path), "HYPERPOD_ADMIN_CONFIG": ""}
    result = CliRunner().invoke(status, ["--url", url, "--munge-socket", str(mungeds[1])], env=env)
    assert result.exit_code == 1
    assert result.output.startswith("hyperpod: error: MUNGE credential rejected: ")
    assert result.output.endswith("(HTTP 401, auth)\n")


# Hypothesis: no MUNGE credential, however made, gets anything but a 4xx refusal.
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
LATIN1 = st.characters(min_codepoint=0, max_codepoint=255)
JSON_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**20, max_value=10**40)
    | st.floats()  # NaN and infinities included: json.dumps writes NaN, Infinity
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
CLAIM = st.sampled_from(["v", "m", "p", "b", "t", "n", "x"])


def _refused_4xx(server: ServerAuth, value: str, body: bytes = b"") -> None:
    try:
        server.verify("GET", "/v1/status", {"Authorization": value}, body)
    except AuthError as exc:
        assert 400 <= exc.status < 500, (value[:80], exc.status, str(exc))


@FUZZ
@given(changes=st.dictionaries(CLAIM, JSON_VALUE, max_size=4), drop=st.sets(CLAIM, max_size=2))
def test_fuzzed_payload_fields_are_4xx(
    sock: Path, changes: dict[str, object], drop: set[str]
) -> None:
    claims: dict[str, object] = {
        "v": 1,
        "m": "GET",
        "p": "/v1/status",
        "b": body_digest(b""),
        "t": time.time(),
        "n": None,
    }
    claims.update(changes)
    for key in drop:
        claims.pop(key, None)
    cred = _munge.encode(json.dumps(claims).encode(), sock)
    _refused_4xx(ServerAuth(AuthConfig(munge_socket=sock)), "MUNGE " + cred)


@FUZZ
@given(text=st.text(LATIN1, max_size=200))
def test_fuzzed_credential_text_is_4xx(sock: Path, text: str) -> None:
    server = ServerAuth(AuthConfig(munge_socket=sock))
    _refused_4xx(server, "MUNGE " + text)
    _refused_4xx(server, "MUNGE MUNGE:" + text)


@FUZZ
@given(at=st.integers(0, 400), char=LATIN1)
def test_a_mutated_credential_is_4xx(sock: Path, at: int, char: str) -> None:
    cred = ClientAuth(AuthConfig(munge_socket=sock)).headers("GET", "/v1/status", b"")
    value = cred["Authorization"]
    index = at % len(value)
    _refused_4xx(
        ServerAuth(AuthConfig(munge_socket=sock)), value[:index] + char + value[index + 1 :]
    )


@pytest.mark.parametrize(
    ("stamp", "message"),
    [
        ("NaN", "not a request binding"),  # NaN is not JSON
        ("Infinity", "not a request binding"),
        ("1e400", "not a plausible time"),
        ("1e308", "not a plausible time"),
        ('"soon"', "no timestamp"),
        ("true", "no timestamp"),
    ],
)
def test_a_non_finite_or_absurd_stamp_is_refused(sock: Path, stamp: str, message: str) -> None:
    payload = (
        f'{{"v": 1, "m": "GET", "p": "/v1/status", "b": "{body_digest(b"")}", '
        f'"t": {stamp}, "n": null}}'
    )
    value = "MUNGE " + _munge.encode(payload.encode(), sock)
    server = ServerAuth(AuthConfig(munge_socket=sock))
    with pytest.raises(AuthError, match=message) as info:
        server.verify("GET", "/v1/status", {"Authorization": value}, b"")
    assert info.value.status == 401
    with pytest.raises(AuthError) as info:  # nor can it be replayed
        server.verify("GET", "/v1/status", {"Authorization": value}, b"")
    assert info.value.status == 401


def test_a_deeply_nested_payload_is_401(sock: Path) -> None:
    # Anyone in the realm can wrap any payload: parsing it must not exhaust the stack.
    payload = b'{"v": 1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    value = "MUNGE " + _munge.encode(payload, sock)
    with pytest.raises(AuthError, match="not a request binding") as info:
        ServerAuth(AuthConfig(munge_socket=sock)).verify(
            "GET", "/v1/status", {"Authorization": value}, b""
        )
    assert info.value.status == 401
