"""Client of a peer's replica server (protocol in replica.py): one connection per client,
opened with the handshake and reopened after a failure. Everything a peer sends back is
checked before it is used: sizes against what was asked (metadata: 64 MiB at most), the
step listing's shape, so a faulty or hostile peer costs a fallback, never a crash."""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import Any

import numpy as np

from hyperpod_agent.checkpoint import handshake, wire
from hyperpod_agent.checkpoint.errors import ReplicaError

MAX_META = 64 << 20  # a rank's metadata: a skeleton and one entry per leaf
_MIN_PART = 16 << 20  # below this per connection, a parallel fetch costs more than it gains
_STEP = re.compile(r"[0-9]{1,10}", re.ASCII)


class ReplicaClient:
    """Talk to one peer's replica server about one run's files."""

    def __init__(
        self,
        host: str,
        port: int,
        run: str,
        *,
        node: str = "",
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        secret: bytes | None = None,
    ):
        self.host, self.port, self.run = host, port, run
        self.node = node or f"{host}:{port}"
        self.secret = secret
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def clone(self) -> ReplicaClient:
        """Another client of the same peer and run (for a parallel fetch)."""
        return ReplicaClient(
            self.host,
            self.port,
            self.run,
            node=self.node,
            timeout=self.timeout,
            connect_timeout=self.connect_timeout,
            secret=self.secret,
        )

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        deadline = time.monotonic() + self.connect_timeout
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
                break
            except OSError as exc:
                # The peer's server may still be starting (its job step starts at its own pace).
                if time.monotonic() >= deadline:
                    raise ReplicaError(
                        f"peer {self.node} ({self.host}:{self.port}): couldn't "
                        f"connect: {exc.strerror or exc}"
                    ) from exc
                time.sleep(0.2)
        wire.no_delay(sock)
        try:
            handshake.connect(sock, self.secret, self.node)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        return sock

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
        max_size: int = MAX_META,
    ) -> tuple[dict[str, Any], np.ndarray | None]:
        header = {**header, "run": self.run}
        with self._lock:
            try:
                sock = self._connect()
                try:
                    wire.send_msg(sock, header, body)
                except OSError:
                    # The server may have refused the header and closed without reading the
                    # body (a bad name, no room): its answer says why, if it is there.
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
                if header["op"] == "get":
                    data = self._body(sock, header, reply, into, max_size)
                return reply, data
            except ReplicaError:
                raise
            except (OSError, ConnectionError, ValueError) as exc:
                self.close()
                raise ReplicaError(f"peer {self.node}: {header['op']} failed: {exc}") from exc

    def _body(
        self,
        sock: socket.socket,
        header: dict[str, Any],
        reply: dict[str, Any],
        into: np.ndarray | None,
        max_size: int,
    ) -> np.ndarray:
        size = reply.get("size")
        wanted = into.size if into is not None else max_size
        bad = not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= wanted
        if not bad and into is not None:
            bad = size != into.size or reply.get("offset") != header.get("offset")
        if bad:
            self.close()  # the body is not read: this connection is out of step
            raise ReplicaError(
                f"peer {self.node}: sent {size!r} bytes at {reply.get('offset')} of "
                f"{header['name']}, asked for {wanted} at {header.get('offset', 0)}"
            )
        assert isinstance(size, int)
        data = into if into is not None else np.empty(size, dtype=np.uint8)
        wire.recv_into(sock, data.data)
        return data

    def put(self, step: int, name: str, body: Any) -> None:
        """Store one shard file on the peer."""
        size = memoryview(body).nbytes
        self._call({"op": "put", "step": step, "name": name, "size": size}, body)

    def get(self, step: int, name: str, max_size: int = MAX_META) -> np.ndarray:
        """Fetch one whole shard file of at most ``max_size`` bytes from the peer."""
        _, data = self._call({"op": "get", "step": step, "name": name}, max_size=max_size)
        assert data is not None
        return data

    def get_range(self, step: int, name: str, offset: int, into: np.ndarray) -> int:
        """Fetch ``into.size`` bytes at ``offset`` of a shard file straight into ``into``;
        return the whole file's size."""
        header = {"op": "get", "step": step, "name": name, "offset": offset, "length": into.size}
        reply, _ = self._call(header, into=into)
        total = reply.get("total")
        return total if isinstance(total, int) and not isinstance(total, bool) else -1

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
        extra = [self.clone() for _ in range(parts - 1)]
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
        """Steps the peer holds of this run -> ranks with complete shards."""
        reply, _ = self._call({"op": "list"})
        listing = reply.get("steps")
        out: dict[int, set[int]] = {}
        if isinstance(listing, dict):
            for s, ranks in listing.items():
                if not (isinstance(s, str) and _STEP.fullmatch(s) and isinstance(ranks, list)):
                    break
                if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
                    break
                out[int(s)] = set(ranks)
            else:
                return out
        self.close()
        raise ReplicaError(f"peer {self.node}: malformed step listing")

    def prune(self, ranks: list[int], keep: int) -> list[int]:
        """Apply retention to the given ranks' replicas on the peer."""
        reply, _ = self._call({"op": "prune", "ranks": ranks, "keep": keep})
        removed = reply.get("removed")
        if not isinstance(removed, list):
            raise ReplicaError(f"peer {self.node}: malformed prune reply")
        return [r for r in removed if isinstance(r, int)]
