"""Token mode: per-node keys derived from a cluster secret, replay and staleness."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig, AuthError, Identity, require_admin, require_node
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.auth.tokens import derive_key, token_signature
from hyperpod_agent.errors import ConfigError

SECRET = b"s" * 48
NOW = 1_800_000_000.0


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.secret"
    path.write_bytes(SECRET + b"\n")
    return path


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server(secret_file: Path, clock: Clock) -> ServerAuth:
    return ServerAuth(AuthConfig(mode="token", token_secret_file=secret_file), clock=clock)


def node_client(tmp_path: Path, node: str, clock: Clock, secret: bytes = SECRET) -> ClientAuth:
    key = tmp_path / f"{node}.key"
    key.write_text(derive_key(secret, "node:" + node).hex() + "\n")
    return ClientAuth(AuthConfig(mode="token", token_key_file=key), node, clock=clock)


def admin_client(secret_file: Path, clock: Clock) -> ClientAuth:
    return ClientAuth(AuthConfig(mode="token", token_secret_file=secret_file), clock=clock)


def test_node_key_authenticates_its_node_only(
    server: ServerAuth, tmp_path: Path, clock: Clock
) -> None:
    client = node_client(tmp_path, "node1", clock)
    body = b'{"node": "node1"}'
    ident = server.verify("POST", "/v1/reports", client.headers("POST", "/v1/reports", body), body)
    assert ident == Identity(uid=-1, gid=-1, node="node1", is_admin=False, method="token")
    require_node(ident, "node1")
    with pytest.raises(AuthError, match="may not report for node node2") as info:
        require_node(ident, "node2")
    assert info.value.status == 403
    with pytest.raises(AuthError, match="not an admin"):
        require_admin(ident)


def test_node_key_cannot_claim_another_node(
    server: ServerAuth, tmp_path: Path, clock: Clock
) -> None:
    client = node_client(tmp_path, "node1", clock)
    headers = client.headers("POST", "/v1/reports", b"{}")
    forged = {"Authorization": headers["Authorization"].replace("node=node1", "node=node2")}
    with pytest.raises(AuthError, match="bad HPTOKEN signature for node:node2") as info:
        server.verify("POST", "/v1/reports", forged, b"{}")
    assert info.value.status == 401


def test_node_key_cannot_pose_as_admin(server: ServerAuth, tmp_path: Path, clock: Clock) -> None:
    client = node_client(tmp_path, "node1", clock)
    value = client.headers("POST", "/v1/nodes/node2/actions", b"{}")["Authorization"]
    forged = {"Authorization": value.replace("node=node1", "role=admin")}
    with pytest.raises(AuthError, match="bad HPTOKEN signature for admin"):
        server.verify("POST", "/v1/nodes/node2/actions", forged, b"{}")


def test_admin_key_derived_from_secret(server: ServerAuth, secret_file: Path, clock: Clock) -> None:
    client = admin_client(secret_file, clock)
    ident = server.verify("GET", "/v1/nodes", client.headers("GET", "/v1/nodes", b""), b"")
    assert ident.is_admin and ident.node is None and ident.method == "token"
    require_admin(ident)


def test_key_from_another_secret_is_refused(
    server: ServerAuth, tmp_path: Path, clock: Clock
) -> None:
    client = node_client(tmp_path, "node1", clock, secret=b"x" * 48)
    with pytest.raises(AuthError, match="bad HPTOKEN signature"):
        server.verify("GET", "/v1/status", client.headers("GET", "/v1/status", b""), b"")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/reports", b"{}"),
        ("POST", "/v1/heartbeats", b"{}"),
        ("POST", "/v1/reports", b'{"x": 1}'),
    ],
)
def test_signature_binds_method_path_and_body(
    server: ServerAuth, tmp_path: Path, clock: Clock, method: str, path: str, body: bytes
) -> None:
    client = node_client(tmp_path, "node1", clock)
    headers = client.headers("POST", "/v1/reports", b"{}")
    with pytest.raises(AuthError, match="bad HPTOKEN signature"):
        server.verify(method, path, headers, body)


def test_query_string_is_not_bound(server: ServerAuth, secret_file: Path, clock: Clock) -> None:
    client = admin_client(secret_file, clock)
    headers = client.headers("GET", "/v1/events?limit=5", b"")
    assert server.verify("GET", "/v1/events", headers, b"").is_admin


def test_replayed_request_is_refused(server: ServerAuth, tmp_path: Path, clock: Clock) -> None:
    client = node_client(tmp_path, "node1", clock)
    headers = client.headers("POST", "/v1/heartbeats", b"{}")
    server.verify("POST", "/v1/heartbeats", headers, b"{}")
    clock.now += 1
    with pytest.raises(AuthError, match="replayed credential") as info:
        server.verify("POST", "/v1/heartbeats", headers, b"{}")
    assert info.value.status == 401


@pytest.mark.parametrize("offset", [-61.0, 61.0, -3600.0])
def test_stale_or_future_request_is_refused(
    server: ServerAuth, tmp_path: Path, clock: Clock, offset: float
) -> None:
    client = node_client(tmp_path, "node1", clock)
    headers = client.headers("POST", "/v1/heartbeats", b"{}")
    clock.now -= offset
    with pytest.raises(AuthError, match=r"stale credential: timestamp is [+-]\d+ s off"):
        server.verify("POST", "/v1/heartbeats", headers, b"{}")


def test_request_within_skew_is_accepted(server: ServerAuth, tmp_path: Path, clock: Clock) -> None:
    client = node_client(tmp_path, "node1", clock)
    headers = client.headers("POST", "/v1/heartbeats", b"{}")
    clock.now += 59
    assert server.verify("POST", "/v1/heartbeats", headers, b"{}").node == "node1"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "missing Authorization header"),
        ("", "missing Authorization header"),
        ("Bearer abc", "expected an HPTOKEN credential, got scheme 'Bearer'"),
        ("HPTOKEN node=node1 ts=1", "lacks nonce, sig"),
        ("HPTOKEN node=node1 ts=1 nonce=a sig=b color=red", "unknown field 'color'"),
        ("HPTOKEN ts=1 nonce=a sig=b", "neither a node nor role=admin"),
        ("HPTOKEN role=root ts=1 nonce=a sig=b", "neither a node nor role=admin"),
        ("HPTOKEN node=a role=admin ts=1 nonce=a sig=b", "both a node and a role"),
        ("HPTOKEN node=../x ts=1 nonce=a sig=b", "invalid node"),
        ("HPTOKEN node=n1 ts=soon nonce=a sig=b", "timestamp is not a number"),
        ("HPTOKEN node=n1 ts ts=1", "malformed Authorization field 'ts'"),
        ("HPTOKEN node=n1 node=n2 ts=1 nonce=a sig=b", "malformed Authorization field"),
    ],
)
def test_malformed_headers_are_refused_precisely(
    server: ServerAuth, value: str | None, message: str
) -> None:
    headers = {} if value is None else {"Authorization": value}
    with pytest.raises(AuthError, match=message) as info:
        server.verify("GET", "/v1/status", headers, b"")
    assert info.value.status == 401


@pytest.mark.parametrize(
    "ts",
    [
        "nan",
        "NaN",
        "inf",
        "-inf",
        "Infinity",
        "1e400",
        "1e30",
        "1_800_000_000",
        "+1800000000",
        "-5",
    ],
)
def test_non_numeric_or_absurd_timestamps_are_refused(
    server: ServerAuth, secret_file: Path, ts: str
) -> None:
    """A signed request whose time is not a plain, sane number is refused (never
    'fresh' because NaN compares false with everything)."""
    headers = _signed(secret_file, "GET", "/v1/status", ts, "ab" * 16)
    for _ in range(2):  # nor can it be replayed
        with pytest.raises(AuthError, match="timestamp") as info:
            server.verify("GET", "/v1/status", headers, b"")
        assert info.value.status == 401


def _signed(secret_file: Path, method: str, path: str, ts: str, nonce: str) -> dict[str, str]:
    key = derive_key(secret_file.read_bytes().strip(), "admin")
    sig = token_signature(key, "admin", method, path, ts, nonce, b"")
    return {"Authorization": f"HPTOKEN role=admin ts={ts} nonce={nonce} sig={sig}"}


@pytest.mark.parametrize(
    "sig", ["\u00e9" * 64, "\u00ff", "z" * 64, "00" * 33, "0" * 63, "\x00" * 64]
)
def test_malformed_signature_is_401_not_a_crash(server: ServerAuth, sig: str) -> None:
    value = f"HPTOKEN role=admin ts={NOW:.3f} nonce={'ab' * 16} sig={sig}"
    with pytest.raises(AuthError, match="signature") as info:
        server.verify("GET", "/v1/status", {"Authorization": value}, b"")
    assert info.value.status == 401


@pytest.mark.parametrize("nonce", ["\u00e9" * 32, "", "x", "g" * 32, "ab" * 100])
def test_malformed_nonce_is_401(server: ServerAuth, secret_file: Path, nonce: str) -> None:
    headers = _signed(secret_file, "GET", "/v1/status", f"{NOW:.3f}", nonce)
    with pytest.raises(AuthError) as info:
        server.verify("GET", "/v1/status", headers, b"")
    assert info.value.status == 401


def test_one_identity_flooding_gets_429_and_leaves_others_alone(
    secret_file: Path, tmp_path: Path, clock: Clock
) -> None:
    config = AuthConfig(
        mode="token",
        token_secret_file=secret_file,
        replay_cache_size=64,
        replay_cache_per_identity=16,
    )
    server = ServerAuth(config, clock=clock)
    ahead = Clock(NOW + 60)  # stamped at the edge of the allowed skew
    flooder = node_client(tmp_path, "node1", ahead)
    honest = node_client(tmp_path, "node2", clock)
    statuses = []
    for _ in range(20):
        try:
            server.verify("GET", "/v1/status", flooder.headers("GET", "/v1/status", b""), b"")
            statuses.append(200)
        except AuthError as exc:
            statuses.append(exc.status)
    assert statuses == [200] * 16 + [429] * 4
    with pytest.raises(AuthError, match="^token of node node1: too many requests") as info:
        server.verify("GET", "/v1/status", flooder.headers("GET", "/v1/status", b""), b"")
    assert info.value.status == 429
    headers = honest.headers("GET", "/v1/status", b"")
    assert server.verify("GET", "/v1/status", headers, b"").node == "node2"


def test_header_lookup_is_case_insensitive(
    server: ServerAuth, secret_file: Path, clock: Clock
) -> None:
    value = admin_client(secret_file, clock).headers("GET", "/v1/status", b"")["Authorization"]
    assert server.verify("GET", "/v1/status", {"authorization": value}, b"").is_admin


def test_server_needs_the_secret(tmp_path: Path) -> None:
    key = tmp_path / "k"
    key.write_text("00" * 32)
    with pytest.raises(ConfigError, match="the controller needs the secret"):
        ServerAuth(AuthConfig(mode="token", token_key_file=key))


def test_short_secret_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"short")
    with pytest.raises(ConfigError, match=r"secret is 5 bytes, expected at least 32"):
        ServerAuth(AuthConfig(mode="token", token_secret_file=path))


def test_missing_secret_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "absent"
    with pytest.raises(ConfigError, match=f"auth.token_secret_file {path}: No such file"):
        ServerAuth(AuthConfig(mode="token", token_secret_file=path))


@pytest.mark.parametrize("content", ["xyz", "00" * 31, ""])
def test_bad_key_file_is_a_config_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "node.key"
    path.write_text(content)
    with pytest.raises(ConfigError, match="expected 64 hex digits"):
        ClientAuth(AuthConfig(mode="token", token_key_file=path), "node1")


def test_invalid_client_node_name(secret_file: Path) -> None:
    with pytest.raises(ConfigError, match="invalid node name"):
        ClientAuth(AuthConfig(mode="token", token_secret_file=secret_file), "a b")
