"""The controller's HTTP server: uvicorn with an h11 protocol that answers what it refuses.

uvicorn answers a request h11 cannot parse (headers over the limit, a broken request
line) with a plain-text 400 and closes at once; an early answer from the API (413 for a
body still arriving) is followed by a close too. Closing a socket with unread input
makes the kernel send a TCP reset, which destroys the answer in flight: the client sees
"connection reset" instead of a status. Here such requests get the documented error
body (431 ``headers_too_large``, 400 ``bad_request``), counted and logged like every
refusal, and a close with input still unread is a *lingering* close: the answer is
sent, our side shut down for writing, and what the client still sends is read and
dropped, up to ``LINGER_BYTES`` or ``LINGER_S``, before the socket is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, cast

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from hyperpod_agent.controller.api.guard import MAX_HEADER_BYTES, Guard
from hyperpod_agent.controller.api.rejections import Rejections

__all__ = ["MAX_HEADER_BYTES", "GuardedH11Protocol", "OncePerMinute", "make_server"]

LINGER_S = 2.0
LINGER_BYTES = 4 * 1024 * 1024
# What the peer is still sending while its request is unread (or unreadable).
_UNREAD = (h11.SEND_BODY, h11.ERROR)


def make_server(app: Guard, host: str, port: int) -> uvicorn.Server:
    """The uvicorn server for ``app`` (run it with ``server.run(sockets=[...])``)."""
    error_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, OncePerMinute) for f in error_log.filters):
        error_log.addFilter(OncePerMinute())
    return uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            http=protocol_for(app.rejections),
            ws="none",  # the API has no websockets
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            # X-Forwarded-For from a loopback peer must not change the address we log.
            proxy_headers=False,
            server_header=False,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
    )


def protocol_for(rejections: Rejections) -> type[asyncio.Protocol]:
    """The h11 protocol class recording its refusals in ``rejections``."""
    return type("ControllerH11Protocol", (GuardedH11Protocol,), {"rejections": rejections})


class _Connection(h11.Connection):
    """Remembers the last protocol error, which uvicorn does not pass on."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.last_error = exc
            raise


class _LingeringTransport:
    """The socket transport, whose ``close()`` drains unread input first (see above)."""

    def __init__(self, transport: asyncio.Transport, unread: Callable[[], bool], loop: Any) -> None:
        self.transport = transport
        self.unread = unread
        self.loop = loop
        self.lingering = False
        self.dropped = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self.transport.is_closing()

    def close(self) -> None:
        if self.lingering or self.transport.is_closing() or not self.unread():
            self.transport.close()
            return
        self.lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()  # sent once the answer is flushed
        self.transport.resume_reading()
        self.loop.call_later(LINGER_S, self.transport.close)

    def drop(self, data: bytes) -> None:
        self.dropped += len(data)
        if self.dropped > LINGER_BYTES:
            self.transport.close()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, answering unparsable requests in the API's error form."""

    rejections: Rejections

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, MAX_HEADER_BYTES)
        self._lingering: _LingeringTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        socket_transport = cast(asyncio.Transport, transport)  # what uvicorn is given
        super().connection_made(socket_transport)
        self._lingering = _LingeringTransport(socket_transport, self._input_unread, self.loop)
        self.transport = cast(asyncio.Transport, self._lingering)

    def _input_unread(self) -> bool:
        return self.conn.their_state in _UNREAD or bool(self.conn.trailing_data[0])

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None and self._lingering.lingering:
            self._lingering.drop(data)
            return
        super().data_received(data)

    def eof_received(self) -> None:
        if self._lingering is not None and self._lingering.lingering:
            self._lingering.transport.close()

    def send_400_response(self, msg: str) -> None:
        error = self.conn.last_error if isinstance(self.conn, _Connection) else None
        if error is not None and error.error_status_hint == 431:
            status, code = 431, "headers_too_large"
            message = f"request headers larger than {MAX_HEADER_BYTES} bytes"
        else:
            status, code = 400, "bad_request"
            message = f"not a valid HTTP request: {error or msg}"
        peer = self.client[0] if self.client else "unknown address"
        self.rejections.record(status, code, message, str(peer), "?", "(unparsed request)")
        body = json.dumps({"error": {"code": code, "message": message, "details": []}}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        reason = HTTPStatus(status).phrase.encode()
        for event in (
            h11.Response(status_code=status, headers=headers, reason=reason),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()


class OncePerMinute(logging.Filter):
    """Lets each of uvicorn's own warnings through once a minute.

    uvicorn warns once per offending request ("Invalid HTTP request received.",
    "Unsupported upgrade request."); a hostile client must not fill the log with them.
    Our own refusal log counts those requests. Errors always pass.
    """

    MAX_KINDS = 256

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = 60.0):
        super().__init__()
        self.clock = clock
        self.window_s = window_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        kind, now = str(record.msg), self.clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.window_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return False
        if len(self._last) >= self.MAX_KINDS:
            self._last.clear()
            self._held.clear()
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        if held:
            record.msg = f"{record.msg} ({held} more held back in the last {self.window_s:g} s)"
        return True
