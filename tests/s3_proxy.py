"""A loopback HTTP proxy in front of a real S3 server that injects the faults a store meets.

It forwards each request byte for byte (so the client's SigV4 signature stays valid: the
Host header it signed is the proxy's, and the server checks the header it receives) and
serves one request per connection (it adds ``Connection: close``). Faults are queued and
taken by the next matching requests:

- ``slowdown``: answer ``503 SlowDown`` without contacting the server, as S3 does when a
  prefix is throttled;
- ``truncate``: forward the response but cut its body after ``keep`` bytes and close, as a
  connection reset in the middle of a download does;
- ``stall``: read the request and never answer (until the proxy stops), as an overloaded or
  black-holed endpoint does;
- ``hold``: hold the request until :meth:`FaultProxy.release`, then forward it (a slow
  store, for as long as the test wants);
- ``norange`` / ``shiftrange``: drop the request's Range header, or move its start one byte
  on, as a store that ignores or misreads ranges would (this breaks the request's
  signature: use with a server started with ``auth=False``).

With ``partial_status``, a ranged GET answered ``200`` with a ``Content-Range`` header (what
rclone's S3 server sends) is passed on as ``206 Partial Content``, as S3 answers it: some
clients (obstore) refuse anything else, and the benchmark compares them on the same path.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from dataclasses import dataclass
from types import TracebackType

_HEAD_LIMIT = 64 << 10
_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class _Fault:
    kind: str
    count: int
    methods: frozenset[str]
    keep: int
    skip: int


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The request or response head (up to the blank line) and what was read past it."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the end of the head")
        buf += chunk
        if len(buf) > _HEAD_LIMIT:
            raise ConnectionError("head too large")
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _header(head: bytes, name: str) -> str:
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name.encode():
            return v.strip().decode("latin-1")
    return ""


def _with_close(head: bytes) -> bytes:
    lines = [
        ln
        for ln in head.rstrip(b"\r\n").split(b"\r\n")
        if not ln.lower().startswith(b"connection:")
    ]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"


def _rewrite_range(head: bytes, shift: bool) -> bytes:
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    out = []
    for ln in lines:
        if ln.lower().startswith(b"range:"):
            if not shift:
                continue
            a, _, b = ln.split(b"=", 1)[1].strip().partition(b"-")
            ln = b"Range: bytes=%d-%s" % (int(a) + 1, b)
        out.append(ln)
    return b"\r\n".join(out) + b"\r\n\r\n"


class FaultProxy:
    """Forward loopback connections to ``upstream_port``, injecting queued faults."""

    def __init__(self, upstream_port: int, timeout: float = 30, *, partial_status: bool = False):
        self.upstream = ("127.0.0.1", upstream_port)
        self.timeout = timeout
        self.partial_status = partial_status
        self.served: Counter[str] = Counter()  # faults injected so far, by kind
        self.requests = 0
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._released = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._threads: list[threading.Thread] = []

    def start(self) -> FaultProxy:
        """Start accepting connections."""
        t = threading.Thread(target=self._accept, name="s3-fault-proxy", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def inject(
        self,
        kind: str,
        count: int = 1,
        *,
        methods: tuple[str, ...] = (),
        keep: int = 0,
        skip: int = 0,
    ) -> None:
        """Queue a fault for the next ``count`` requests (of ``methods``, default any), after
        letting ``skip`` of them through."""
        if kind not in ("slowdown", "truncate", "stall", "hold", "norange", "shiftrange"):
            raise ValueError(f"unknown fault {kind!r}")
        with self._lock:
            self._faults.append(_Fault(kind, count, frozenset(methods), keep, skip))

    def release(self) -> None:
        """Let every held request (and every later one) through."""
        self._released.set()

    def clear(self) -> None:
        """Drop the faults not yet served."""
        with self._lock:
            self._faults.clear()

    def _take(self, method: str) -> _Fault | None:
        with self._lock:
            self.requests += 1
            for f in self._faults:
                if f.count > 0 and (not f.methods or method in f.methods):
                    if f.skip > 0:
                        f.skip -= 1
                        return None
                    f.count -= 1
                    self.served[f.kind] += 1
                    return f
        return None

    def _accept(self) -> None:
        self._listener.settimeout(0.2)  # so that stop() is seen without a connection
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(self.timeout)
        try:
            head, rest = _read_head(client)
            method = head.split(b" ", 1)[0].decode("latin-1")
            fault = self._take(method)
            if fault is not None and fault.kind in ("norange", "shiftrange"):
                head = _rewrite_range(head, fault.kind == "shiftrange")
            if fault is not None and fault.kind == "hold":
                self._released.wait(self.timeout)
            if fault is None or fault.kind in ("truncate", "hold", "norange", "shiftrange"):
                keep = fault.keep if fault is not None and fault.kind == "truncate" else -1
                self._forward(client, head, rest, keep)
            elif fault.kind == "slowdown":
                self._slowdown(client, head, rest)
            else:
                self._stop.wait(self.timeout)  # stall: hold the connection, answer nothing
        except OSError:
            pass  # the client gave up or the server went away: nothing to report
        finally:
            client.close()

    def _slowdown(self, client: socket.socket, head: bytes, rest: bytes) -> None:
        if _header(head, "expect").lower() != "100-continue":
            # Read the body the client is sending, or it sees a reset instead of our answer.
            left = int(_header(head, "content-length") or 0) - len(rest)
            while left > 0:
                chunk = client.recv(min(left, 1 << 20))
                if not chunk:
                    return
                left -= len(chunk)
        client.sendall(
            b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
            + f"Content-Length: {len(_SLOWDOWN)}\r\n".encode()
            + b"Connection: close\r\n\r\n"
            + _SLOWDOWN
        )

    def _forward(self, client: socket.socket, head: bytes, rest: bytes, keep: int) -> None:
        ranged = bool(_header(head, "range"))
        with socket.create_connection(self.upstream, timeout=self.timeout) as up:
            up.sendall(_with_close(head) + rest)
            pump = threading.Thread(target=self._pump, args=(client, up), daemon=True)
            pump.start()  # the rest of the request body, as the client sends it
            rhead, body = _read_head(up)
            while rhead.split(b" ", 2)[1] == b"100":  # an interim answer: pass it on
                client.sendall(rhead)
                rhead, body = _read_head(up)
            if self.partial_status and ranged and rhead.startswith(b"HTTP/1.1 200 "):
                if _header(rhead, "content-range"):
                    rhead = b"HTTP/1.1 206 Partial Content" + rhead[rhead.index(b"\r\n") :]
            client.sendall(rhead)
            if keep >= 0:
                body = body[:keep]
            client.sendall(body)
            sent = len(body)
            buf = memoryview(bytearray(1 << 20))
            while keep < 0 or sent < keep:
                n = up.recv_into(buf, len(buf) if keep < 0 else min(len(buf), keep - sent))
                if not n:
                    return
                client.sendall(buf[:n])
                sent += n
            client.shutdown(socket.SHUT_RDWR)  # truncated: the client sees the body end early

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 20):
                dst.sendall(chunk)
        except OSError:
            pass

    def stop(self) -> None:
        """Stop accepting, release stalled connections and wait for the handlers (bounded)."""
        self._stop.set()
        self._listener.close()
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
