"""Framing of the peer replica protocol: a 4-byte big-endian length, a JSON header, then
the body the header announces. Shared by the replica server and its clients."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from typing import Any

MAX_HEADER = 1 << 20
CHUNK = 8 << 20
SMALL = 64 << 10


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes (a header); ConnectionError if the peer hangs up first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("connection closed")
        got += k
    return bytes(buf)


def recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from the socket (a body straight into its destination buffer)."""
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:], min(CHUNK, len(view) - got))
        if not k:
            raise ConnectionError("connection closed mid-body")
        got += k


def stream_body(sock: socket.socket, size: int) -> Iterator[memoryview]:
    """Yield a body of ``size`` bytes in chunks through one reused buffer (no full copy)."""
    buf = bytearray(min(size, CHUNK))
    view = memoryview(buf)
    left = size
    while left:
        part = view[: min(left, len(buf))]
        recv_into(sock, part)
        left -= len(part)
        yield part


def no_delay(sock: socket.socket) -> None:
    """Requests and replies are header-then-body writes; with Nagle's algorithm the second
    write of a small reply waits for the peer's delayed ACK (40 ms per request on Linux)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def send_msg(sock: socket.socket, header: dict[str, Any], body: Any = None) -> None:
    """Send one framed message."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    frame = struct.pack(">I", len(raw)) + raw
    view = memoryview(body).cast("B") if body is not None else memoryview(b"")
    if len(view) <= SMALL:
        sock.sendall(frame + view)  # one segment: a small reply is not split in two
        return
    sock.sendall(frame)
    for start in range(0, len(view), CHUNK):
        sock.sendall(view[start : start + CHUNK])


def recv_header(sock: socket.socket) -> dict[str, Any] | None:
    """Receive one header; None on a clean end of connection."""
    first = sock.recv(4, socket.MSG_WAITALL)
    if not first:
        return None
    if len(first) < 4:
        raise ConnectionError("truncated frame")
    (n,) = struct.unpack(">I", first)
    if n > MAX_HEADER:
        raise ValueError(f"header of {n} bytes exceeds {MAX_HEADER}")
    obj = json.loads(recv_exact(sock, n))
    if not isinstance(obj, dict):
        raise ValueError("header is not a JSON object")
    return obj


def pending_refusal(sock: socket.socket) -> str | None:
    """An error reply already waiting on ``sock``, if any (read without blocking long)."""
    try:
        sock.settimeout(1.0)
        reply = recv_header(sock)
    except (OSError, ValueError):
        return None
    if reply is None or reply.get("ok"):
        return None
    return str(reply.get("error", "refused"))
