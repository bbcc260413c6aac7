"""Mutual authentication of a replica connection, by challenge and response.

On connect the server sends a hello with a fresh nonce. A client holding the secret answers
with its own nonce and ``HMAC-SHA256(secret, client role, both nonces)``; the server checks it
in constant time and proves itself with the same construction under the server role. So:

- the secret never crosses the network (a sniffer learns nothing it can reuse);
- a captured exchange cannot be replayed (the server's nonce is new on every connection);
- a client trusts only a server that holds the secret too: a stranger listening on a dead
  peer's port cannot hand a restoring rank its own "replicas".

Without a secret on both ends (a server bound to loopback only) there is no handshake.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import socket

from hyperpod_agent.checkpoint import wire
from hyperpod_agent.checkpoint.errors import CheckpointConfigError, ReplicaError

PROTOCOL = "hyperpod-ckpt-replica/2"
MIN_SECRET = 16  # bytes
_NONCE = re.compile(r"[0-9a-f]{32}", re.ASCII)


class Refused(Exception):
    """The peer failed authentication; the message says why (sent to the peer as is)."""


def as_secret(value: bytes | str | None, what: str = "secret") -> bytes | None:
    """A secret as bytes; None stays None; one too short to resist guessing is refused."""
    if value is None:
        return None
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if len(raw) < MIN_SECRET:
        raise CheckpointConfigError(
            f"{what}: {len(raw)} bytes is too short; use at least {MIN_SECRET} "
            "(e.g. openssl rand -hex 16)"
        )
    return raw


def _mac(secret: bytes, role: str, server_nonce: str, client_nonce: str) -> str:
    msg = "\0".join((PROTOCOL, role, server_nonce, client_nonce)).encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def serve(sock: socket.socket, secret: bytes | None) -> None:
    """Server side, right after accept. Raises Refused (after telling the client) or
    OSError/ValueError if the connection breaks or speaks something else."""
    nonce = secrets.token_hex(16)
    wire.send_msg(sock, {"ok": True, "hello": PROTOCOL, "nonce": nonce, "auth": secret is not None})
    if secret is None:
        return
    msg = wire.recv_header(sock)
    if msg is None:
        raise ConnectionError("closed before authenticating")
    theirs, mac = msg.get("nonce"), msg.get("mac")
    why = ""
    if msg.get("op") != "auth":
        why = "unauthorized: this server requires the job's secret"
    elif not (isinstance(theirs, str) and _NONCE.fullmatch(theirs) and isinstance(mac, str)):
        why = "unauthorized: malformed authentication"
    elif not hmac.compare_digest(mac.encode(), _mac(secret, "client", nonce, theirs).encode()):
        why = "unauthorized: wrong secret"
    if why:
        wire.send_msg(sock, {"ok": False, "error": why})
        raise Refused(why)
    assert isinstance(theirs, str)
    wire.send_msg(sock, {"ok": True, "mac": _mac(secret, "server", nonce, theirs)})


def connect(sock: socket.socket, secret: bytes | None, node: str) -> None:
    """Client side, right after connect; raises ReplicaError naming the peer on failure."""
    try:
        hello = wire.recv_header(sock)
    except (OSError, ValueError) as exc:
        raise ReplicaError(f"peer {node}: no hello: {exc}") from exc
    if hello is None or not hello.get("ok"):
        why = (hello or {}).get("error", "connection closed")
        raise ReplicaError(f"peer {node}: refused the connection: {why}")
    if hello.get("hello") != PROTOCOL:
        raise ReplicaError(f"peer {node}: speaks {hello.get('hello')!r}, not {PROTOCOL}")
    server_nonce = hello.get("nonce")
    if not (isinstance(server_nonce, str) and _NONCE.fullmatch(server_nonce)):
        raise ReplicaError(f"peer {node}: malformed hello")
    if not hello.get("auth"):
        if secret is not None:
            raise ReplicaError(
                f"peer {node}: does not authenticate; refusing to trust its replicas"
            )
        return
    if secret is None:
        raise ReplicaError(f"peer {node}: requires the job's secret, and none is set")
    mine = secrets.token_hex(16)
    try:
        wire.send_msg(
            sock, {"op": "auth", "nonce": mine, "mac": _mac(secret, "client", server_nonce, mine)}
        )
        reply = wire.recv_header(sock)
    except (OSError, ValueError) as exc:
        raise ReplicaError(f"peer {node}: authentication failed: {exc}") from exc
    if reply is None or not reply.get("ok"):
        raise ReplicaError(f"peer {node}: {(reply or {}).get('error', 'connection closed')}")
    proof = reply.get("mac")
    want = _mac(secret, "server", server_nonce, mine)
    if not (isinstance(proof, str) and hmac.compare_digest(proof.encode(), want.encode())):
        raise ReplicaError(f"peer {node}: could not prove it holds the job's secret")
