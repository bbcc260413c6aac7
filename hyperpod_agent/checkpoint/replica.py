"""Peer replica tier: a small TCP server that keeps other nodes' shards in its memory tier.

Wire format, one request after another on a connection: a 4-byte big-endian length, a JSON
header, then ``size`` bytes of body if the header says so. Replies use the same framing.
A connection opens with the handshake of ``handshake.py`` (the server's hello, then, with a
secret, a challenge and response both ways). Every request names the run it is for:

    {"op": "put", "run": R, "step": S, "name": "rank-00003.bin", "size": N} + N -> {"ok": true}
    {"op": "get", "run": R, "step": S, "name": "rank-00003.json"}  -> {"ok": true, "size": N} + N
    {"op": "get", ..., "offset": O, "length": L}  -> {"ok": true, "size": L, "offset": O} + L
    {"op": "list", "run": R}                       -> {"ok": true, "steps": {"S": [ranks]}}
    {"op": "prune", "run": R, "ranks": [..], "keep": K}  -> {"ok": true, "removed": [S, ..]}

The server's root is a job's memory directory; run R's files live in ``<root>/run-R/``, the
directory the run's own ranks on this node write directly (identity.py), so one server can
serve every run of a job and a run never sees another's replicas. Files use the memory
tier's crash-safe layout; every name is checked against the shard pattern; a put is refused
before its body is read when it is larger than the room left on the memory file system
(metadata: 64 MiB); connections are capped per peer address and in all. A bad request is
answered with an error and the server goes on. Integrity is end to end: the rank metadata
carries the checksums, verified by the reader.

A server needs a secret to listen on anything but loopback: the run's own (``run.json`` in
the persistent directory) for a server hosted by a training process, or the job's
(``HYPERPOD_CHECKPOINT_SECRET``) for a standalone one.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import socketserver
import threading
from pathlib import Path
from typing import Any

from hyperpod_agent.checkpoint import _threads, handshake, layout, perms, wire
from hyperpod_agent.checkpoint._threads import lower_priority
from hyperpod_agent.checkpoint.errors import CheckpointStorageError, ReplicaError
from hyperpod_agent.checkpoint.replica_client import MAX_META, ReplicaClient

log = logging.getLogger(__name__)

PER_PEER = 256  # every rank of a node restores over several streams (peer_streams)
TOTAL = 1024
_RUN = re.compile(r"[0-9a-f]{32}", re.ASCII)

__all__ = ["ReplicaClient", "ReplicaServer", "is_loopback"]


def is_loopback(host: str) -> bool:
    """True if ``host`` names only this machine (no secret is required there)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _Handler(socketserver.BaseRequestHandler):
    server: ReplicaServer._Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        owner = self.server.owner
        wire.no_delay(sock)
        lower_priority(_threads.NETWORK)  # serving replicas must not slow this node's training
        peer = self.client_address[0]
        # An unauthenticated connection holds a slot for auth_timeout at most.
        sock.settimeout(owner.auth_timeout)
        try:
            handshake.serve(sock, owner.secret)
        except handshake.Refused as exc:
            log.warning("replica server: refused %s: %s", peer, exc)
            return
        except (OSError, ValueError) as exc:
            log.debug("replica server: handshake with %s ended: %s", peer, exc)
            return
        sock.settimeout(owner.io_timeout)
        while True:
            try:
                header = wire.recv_header(sock)
                if header is None:
                    return
                owner.dispatch(sock, header)
            except (ValueError, KeyError, TypeError, CheckpointStorageError) as exc:
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
    """Serve a job's memory directory to peers: store their shards and hand shards back."""

    class _Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True
        owner: ReplicaServer

        def verify_request(self, request: Any, client_address: Any) -> bool:
            return self.owner._admit(request, str(client_address[0]))

        def process_request(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request(request, client_address)
            except BaseException:
                self.owner._release(str(client_address[0]))
                raise

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.owner._release(str(client_address[0]))

    def __init__(
        self,
        root: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        secret: bytes | str | None = None,
        max_body: int | None = None,
        io_timeout: float = 60.0,
        auth_timeout: float = 10.0,
        max_conns_per_peer: int = PER_PEER,
        max_conns: int = TOTAL,
    ):
        self.secret = handshake.as_secret(secret)
        if self.secret is None and not is_loopback(host):
            raise ReplicaError(
                f"replica server: refusing to listen on {host or '*'} without a secret "
                "(any host could read and overwrite the replicas); set one, or bind to "
                "127.0.0.1"
            )
        self.root = perms.private_dir(Path(root), "replica directory")
        self.max_body = max_body
        self.io_timeout, self.auth_timeout = io_timeout, auth_timeout
        self.max_conns_per_peer, self.max_conns = max_conns_per_peer, max_conns
        self._conns: dict[str, int] = {}
        self._conn_lock = threading.Lock()
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
        """Serve in a daemon thread (for hosting inside a training process)."""
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

    def _admit(self, sock: socket.socket, host: str) -> bool:
        """Count a new connection, or refuse it (with a reason) when over a limit."""
        with self._conn_lock:
            mine = self._conns.get(host, 0)
            total = sum(self._conns.values())
            if mine < self.max_conns_per_peer and total < self.max_conns:
                self._conns[host] = mine + 1
                return True
        log.warning(
            "replica server: refused a connection from %s: too many (%d from it, %d in all)",
            host,
            mine,
            total,
        )
        try:
            sock.settimeout(0.5)
            wire.send_msg(sock, {"ok": False, "error": "too many connections"})
        except OSError:
            pass
        return False

    def _release(self, host: str) -> None:
        with self._conn_lock:
            left = self._conns.get(host, 0) - 1
            if left > 0:
                self._conns[host] = left
            else:
                self._conns.pop(host, None)

    def connections(self) -> dict[str, int]:
        """Open connections by peer address."""
        with self._conn_lock:
            return dict(self._conns)

    def _run_dir(self, header: dict[str, Any]) -> Path:
        run = header.get("run")
        if not isinstance(run, str) or not _RUN.fullmatch(run):
            raise ValueError(f"bad run {run!r}")
        return self.root / f"run-{run}"

    def _path(self, header: dict[str, Any]) -> Path:
        step, name = header.get("step"), header.get("name")
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 10**10:
            raise ValueError(f"bad step {step!r}")
        if not isinstance(name, str) or not layout.valid_shard_name(name):
            raise ValueError(f"bad shard name {name!r}")
        return layout.step_dir(self._run_dir(header), step) / name

    def room(self) -> int:
        """The largest data put accepted now: what the memory file system has left."""
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        return free if self.max_body is None else min(free, self.max_body)

    def dispatch(self, sock: socket.socket, header: dict[str, Any]) -> None:
        """Carry out one request."""
        op = header.get("op")
        if op == "put":
            self._put(sock, header)
        elif op == "get":
            self._get(sock, header)
        elif op == "list":
            steps = {str(s): sorted(i.ranks) for s, i in layout.scan(self._run_dir(header)).items()}
            wire.send_msg(sock, {"ok": True, "steps": steps})
        elif op == "prune":
            ranks, keep = header["ranks"], header["keep"]
            if not isinstance(keep, int) or not all(isinstance(r, int) for r in ranks):
                raise ValueError("prune needs int keep and int ranks")
            removed = layout.prune(self._run_dir(header), keep, ranks)
            wire.send_msg(sock, {"ok": True, "removed": removed})
        else:
            raise ValueError(f"unknown op {op!r}")

    def _put(self, sock: socket.socket, header: dict[str, Any]) -> None:
        path = self._path(header)
        size = header.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"bad size {size!r}")
        # Refused before a byte of the body is read: a put can never fill the node's memory.
        limit = MAX_META if path.suffix == ".json" else self.room()
        if size > limit:
            raise CheckpointStorageError(
                f"{path.name} of step {header['step']}: {size} bytes refused, room for {limit} here"
            )
        run_dir = self._run_dir(header)
        try:
            os.mkdir(run_dir, 0o700)
        except FileExistsError:
            pass
        layout.atomic_write(path, wire.stream_body(sock, size))
        wire.send_msg(sock, {"ok": True})

    def _get(self, sock: socket.socket, header: dict[str, Any]) -> None:
        path = self._path(header)
        try:
            with open(path, "rb") as f:
                total = f.seek(0, 2)
                f.seek(0)
                if "offset" in header or "length" in header:
                    offset, size = _range(header, total, f"{path.name} of step {header['step']}")
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
