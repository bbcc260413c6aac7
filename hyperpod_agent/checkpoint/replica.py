"""Peer replica tier: a small TCP server that keeps other nodes' shards in its memory tier.

Wire format, one request after another on a connection: a 4-byte big-endian length, a JSON
header, then ``size`` bytes of body if the header says so. Replies use the same framing.

    {"op": "put", "step": S, "name": "rank-00003.bin", "size": N}  + N bytes -> {"ok": true}
    {"op": "get", "step": S, "name": "rank-00003.json"}            -> {"ok": true, "size": N} + N
    {"op": "get", ..., "offset": O, "length": L}       -> {"ok": true, "size": L, "offset": O} + L
    {"op": "list"}                                  -> {"ok": true, "steps": {"S": [ranks]}}
    {"op": "prune", "ranks": [..], "keep": K}       -> {"ok": true, "removed": [S, ..]}

The server stores files with the same crash-safe layout as the memory tier (it serves that
directory), checks every name against the shard pattern and every size against a limit, and
answers a bad request with an error instead of failing. With a token, every header must
carry it (``"token": T``) or the request is refused. Integrity is end to end: the rank
metadata carries the checksums, verified by the reader.
"""

from __future__ import annotations

import hmac
import logging
import socket
import socketserver
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from hyperpod_agent.checkpoint import _threads, layout, wire
from hyperpod_agent.checkpoint._threads import lower_priority
from hyperpod_agent.checkpoint.errors import ReplicaError

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 64 << 30
_MIN_PART = 16 << 20  # below this per connection, a parallel fetch costs more than it gains


class _Handler(socketserver.BaseRequestHandler):
    server: ReplicaServer._Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(self.server.owner.io_timeout)
        wire.no_delay(sock)
        lower_priority(_threads.NETWORK)  # serving replicas must not slow this node's training
        peer = self.client_address
        while True:
            try:
                header = wire.recv_header(sock)
                if header is None:
                    return
                if not self.server.owner.authorized(header):
                    log.warning("replica server: refused %s: missing or wrong token", peer)
                    wire.send_msg(
                        sock, {"ok": False, "error": "unauthorized: missing or wrong token"}
                    )
                    return
                self.server.owner.dispatch(sock, header)
            except (ValueError, KeyError, TypeError) as exc:
                # A bad request is answered and the connection closed; the server goes on.
                log.warning("replica server: bad request from %s: %s", peer, exc)
                try:
                    wire.send_msg(sock, {"ok": False, "error": str(exc)})
                except OSError:
                    pass
                return
            except (OSError, ConnectionError) as exc:
                log.debug("replica server: connection from %s ended: %s", peer, exc)
                return


def _range(header: dict[str, Any], total: int, what_file: str) -> tuple[int, int]:
    """A validated (offset, length) of a ranged get against a file of ``total`` bytes."""
    offset, length = header.get("offset"), header.get("length")
    for what, v in (("offset", offset), ("length", length)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"bad {what} {v!r}")
    assert isinstance(offset, int) and isinstance(length, int)
    if offset + length > total:
        raise ValueError(f"{what_file}: range {offset}+{length} beyond its {total} bytes")
    return offset, length


class ReplicaServer:
    """Serve a memory-tier directory to peers: store their shards and hand shards back."""

    class _Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True
        owner: ReplicaServer

    def __init__(
        self,
        root: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body: int = DEFAULT_MAX_BODY,
        io_timeout: float = 60.0,
        token: str | None = None,
    ):
        self.root = layout.ensure_dir(Path(root), "replica directory")
        self.token = token or None
        self.max_body = max_body
        self.io_timeout = io_timeout
        try:
            self._server = self._Server((host, port), _Handler)
        except OSError as exc:
            raise ReplicaError(
                f"replica server: couldn't listen on {host}:{port}: {exc.strerror or exc}"
            ) from exc
        self._server.owner = self
        self._thread: threading.Thread | None = None
        self._serving = False

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> ReplicaServer:
        """Serve in a daemon thread (for hosting inside a training process or the node agent)."""
        self._serving = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(0.1,),
            name="hyperpod-ckpt-replica",
            daemon=True,
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until :meth:`stop`."""
        self._serving = True
        self._server.serve_forever()

    def stop(self) -> None:
        """Stop serving (if serving) and close the socket."""
        if self._serving:
            self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def authorized(self, header: dict[str, Any]) -> bool:
        """Without a token every request is served; with one, only requests carrying it."""
        if self.token is None:
            return True
        given = header.get("token")
        return isinstance(given, str) and hmac.compare_digest(
            given.encode(errors="replace"), self.token.encode()
        )

    def _path(self, header: dict[str, Any]) -> Path:
        step, name = header["step"], header["name"]
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 10**10:
            raise ValueError(f"bad step {step!r}")
        if not isinstance(name, str) or not layout.valid_shard_name(name):
            raise ValueError(f"bad shard name {name!r}")
        return layout.step_dir(self.root, step) / name

    def dispatch(self, sock: socket.socket, header: dict[str, Any]) -> None:
        """Carry out one request."""
        op = header.get("op")
        if op == "put":
            path = self._path(header)
            size = header["size"]
            if not isinstance(size, int) or not 0 <= size <= self.max_body:
                raise ValueError(f"bad size {size!r}")
            layout.atomic_write(path, wire.stream_body(sock, size))
            wire.send_msg(sock, {"ok": True})
        elif op == "get":
            path = self._path(header)
            try:
                with open(path, "rb") as f:
                    total = f.seek(0, 2)
                    f.seek(0)
                    if "offset" in header or "length" in header:
                        offset, size = _range(
                            header, total, f"{path.name} of step {header['step']}"
                        )
                        reply = {"ok": True, "size": size, "offset": offset, "total": total}
                        wire.send_msg(sock, reply)
                    else:
                        offset, size = 0, total
                        wire.send_msg(sock, {"ok": True, "size": size})
                    if size:
                        sock.sendfile(f, offset, size)
            except FileNotFoundError:
                wire.send_msg(
                    sock, {"ok": False, "error": f"{path.name} of step {header['step']}: not here"}
                )
        elif op == "list":
            steps = {str(s): sorted(i.ranks) for s, i in layout.scan(self.root).items()}
            wire.send_msg(sock, {"ok": True, "steps": steps})
        elif op == "prune":
            ranks, keep = header["ranks"], header["keep"]
            if not isinstance(keep, int) or not all(isinstance(r, int) for r in ranks):
                raise ValueError("prune needs int keep and int ranks")
            wire.send_msg(sock, {"ok": True, "removed": layout.prune(self.root, keep, ranks)})
        else:
            raise ValueError(f"unknown op {op!r}")


class ReplicaClient:
    """Talk to one peer's replica server; one connection, reopened on failure."""

    def __init__(
        self,
        host: str,
        port: int,
        node: str = "",
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        token: str | None = None,
    ):
        self.host, self.port, self.node = host, port, node or f"{host}:{port}"
        self.token = token or None
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        deadline = time.monotonic() + self.connect_timeout
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
                wire.no_delay(sock)
                self._sock = sock
                return sock
            except OSError as exc:
                # The peer's server may still be starting (its job step starts at its own pace).
                if time.monotonic() >= deadline:
                    raise ReplicaError(
                        f"peer {self.node} ({self.host}:{self.port}): couldn't "
                        f"connect: {exc.strerror or exc}"
                    ) from exc
                time.sleep(0.2)

    def close(self) -> None:
        """Close the connection."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _call(
        self,
        header: dict[str, Any],
        body: Any = None,
        into: np.ndarray | None = None,
    ) -> tuple[dict[str, Any], np.ndarray | None]:
        if self.token is not None:
            header = {**header, "token": self.token}
        with self._lock:
            try:
                sock = self._connect()
                try:
                    wire.send_msg(sock, header, body)
                except OSError:
                    # The server may have refused the header and closed without reading the
                    # body (a wrong token, a bad name): its answer says why, if it is there.
                    refusal = wire.pending_refusal(sock)
                    if refusal is not None:
                        self.close()
                        raise ReplicaError(f"peer {self.node}: {refusal}") from None
                    raise
                reply = wire.recv_header(sock)
                if reply is None:
                    raise ConnectionError("connection closed")
                if not reply.get("ok"):
                    self.close()
                    raise ReplicaError(f"peer {self.node}: {reply.get('error', 'refused')}")
                data = None
                if "size" in reply and header["op"] == "get":
                    size = int(reply["size"])
                    if into is not None and (
                        size != into.size or reply.get("offset") != header.get("offset")
                    ):
                        self.close()  # the body is not read: this connection is out of step
                        raise ReplicaError(
                            f"peer {self.node}: sent {size} bytes at {reply.get('offset')}, "
                            f"asked for {into.size} at {header.get('offset')}"
                        )
                    data = into if into is not None else np.empty(size, dtype=np.uint8)
                    wire.recv_into(sock, data.data)
                return reply, data
            except ReplicaError:
                raise
            except (OSError, ConnectionError, ValueError) as exc:
                self.close()
                raise ReplicaError(f"peer {self.node}: {header['op']} failed: {exc}") from exc

    def put(self, step: int, name: str, body: Any) -> None:
        """Store one shard file on the peer."""
        size = memoryview(body).nbytes
        self._call({"op": "put", "step": step, "name": name, "size": size}, body)

    def get(self, step: int, name: str) -> np.ndarray:
        """Fetch one shard file from the peer."""
        _, data = self._call({"op": "get", "step": step, "name": name})
        assert data is not None
        return data

    def get_range(self, step: int, name: str, offset: int, into: np.ndarray) -> int:
        """Fetch ``into.size`` bytes at ``offset`` of a shard file straight into ``into``;
        return the whole file's size."""
        header = {"op": "get", "step": step, "name": name, "offset": offset, "length": into.size}
        reply, _ = self._call(header, into=into)
        return int(reply.get("total", -1))

    def fetch(self, step: int, name: str, size: int, streams: int = 1) -> np.ndarray:
        """Fetch a whole shard file of known ``size`` over up to ``streams`` connections.

        One TCP stream leaves a fast link (and, on a small host, the second core) idle; the
        parts land in one buffer, each connection filling its own range.
        """
        buf = np.empty(size, dtype=np.uint8)
        parts = max(1, min(streams, size // _MIN_PART))
        if parts == 1:
            self._check_total(step, name, size, self.get_range(step, name, 0, buf))
            return buf
        bounds = [size * i // parts // 4096 * 4096 for i in range(parts)] + [size]
        extra = [
            ReplicaClient(
                self.host, self.port, self.node, self.timeout, self.connect_timeout, self.token
            )
            for _ in range(parts - 1)
        ]
        errors: list[BaseException] = []

        def part(client: ReplicaClient, i: int) -> None:
            try:
                total = client.get_range(step, name, bounds[i], buf[bounds[i] : bounds[i + 1]])
                self._check_total(step, name, size, total)
            except BaseException as exc:  # reported below, after every part has stopped
                errors.append(exc)

        threads = [
            threading.Thread(target=part, args=(c, i + 1), daemon=True) for i, c in enumerate(extra)
        ]
        try:
            for t in threads:
                t.start()
            part(self, 0)
            for t in threads:
                t.join()
        finally:
            for c in extra:
                c.close()
        if errors:
            raise errors[0]
        return buf

    def _check_total(self, step: int, name: str, size: int, total: int) -> None:
        if total != size:
            raise ReplicaError(
                f"peer {self.node}: {name} of step {step} holds {total} bytes, "
                f"its metadata says {size}"
            )

    def steps(self) -> dict[int, set[int]]:
        """Steps the peer holds -> ranks with complete shards."""
        reply, _ = self._call({"op": "list"})
        return {int(s): set(r) for s, r in reply["steps"].items()}

    def prune(self, ranks: list[int], keep: int) -> list[int]:
        """Apply retention to the given ranks' replicas on the peer."""
        reply, _ = self._call({"op": "prune", "ranks": ranks, "keep": keep})
        return list(reply["removed"])
