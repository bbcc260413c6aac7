"""Replica servers: a secret beyond loopback, a challenge instead of the secret on the wire,
mutual proof, and bounded puts and connections."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer, ReplicaError, ReplicaServer, handshake, wire
from hyperpod_agent.checkpoint.replica_client import MAX_META, ReplicaClient

from .conftest import free_port

RUN = "fedcba9876543210" * 2
SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ReplicaServer]:
    srv = ReplicaServer(tmp_path / "srv", "127.0.0.1", free_port(), secret=SECRET).start()
    yield srv
    srv.stop()


def _wait_for(cond: object, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_no_secret_no_listening_beyond_loopback(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "", "10.1.2.3", "node7"):
        with pytest.raises(ReplicaError, match="without a secret"):
            ReplicaServer(tmp_path / "srv", host, 0)
    ReplicaServer(tmp_path / "srv", "0.0.0.0", 0, secret=SECRET).stop()
    ReplicaServer(tmp_path / "srv", "127.0.0.1", 0).stop()


def test_a_short_secret_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="6 bytes is too short"):
        ReplicaServer(tmp_path / "srv", "127.0.0.1", 0, secret="s3cret")


class _Recorder:
    """A TCP relay between a client and a server that keeps every byte both ways."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.sent = bytearray()
        self.received = bytearray()
        # Every socket and pump thread made, so close() ends them: sockets left to the
        # garbage collector warn in whichever thread or test happens to collect them.
        self.conns: list[socket.socket] = []
        self.pumps: list[threading.Thread] = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self.listener.accept()
            except OSError:
                return
            b = socket.create_connection(self.target)
            self.conns += [a, b]
            for src, dst, log in ((a, b, self.sent), (b, a, self.received)):
                pump = threading.Thread(target=self._pump, args=(src, dst, log), daemon=True)
                self.pumps.append(pump)
                pump.start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, log: bytearray) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            log.extend(data)
            dst.sendall(data)

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux)
        except OSError:
            pass
        self.listener.close()
        self.acceptor.join(timeout=10)
        for conn in self.conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for pump in self.pumps:
            pump.join(timeout=10)
        for conn in self.conns:
            conn.close()


def test_the_secret_never_crosses_the_network(server: ReplicaServer) -> None:
    relay = _Recorder(server.address)
    try:
        client = ReplicaClient(*relay.address, RUN, secret=SECRET)
        client.put(1, "rank-00000.bin", b"payload")
        assert client.get(1, "rank-00000.bin").tobytes() == b"payload"
        client.close()
        wire_bytes = bytes(relay.sent + relay.received)
        assert b"payload" in wire_bytes
        for form in (SECRET, SECRET.hex().encode()):
            assert form not in wire_bytes
    finally:
        relay.close()


def test_a_captured_authentication_cannot_be_replayed(server: ReplicaServer) -> None:
    relay = _Recorder(server.address)
    try:
        client = ReplicaClient(*relay.address, RUN, secret=SECRET)
        client.steps()
        client.close()
        _wait_for(lambda: b'"op":"auth"' in relay.sent, "the client's authentication")
    finally:
        relay.close()
    captured = bytes(relay.sent)
    n = int.from_bytes(captured[:4], "big")
    with socket.create_connection(server.address, timeout=10) as s:
        assert wire.recv_header(s) is not None  # a fresh hello, with a fresh nonce
        s.sendall(captured[: 4 + n])  # the earlier answer, to the earlier challenge
        reply = wire.recv_header(s)
    assert reply == {"ok": False, "error": "unauthorized: wrong secret"}


def _impostor(answer: dict[str, object] | None) -> tuple[tuple[str, int], socket.socket]:
    """A server on a port a dead peer used: it asks for authentication and then answers
    ``answer`` whatever the client proves (None: it does not authenticate at all)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            hello = {"ok": True, "hello": handshake.PROTOCOL, "nonce": "a" * 32}
            wire.send_msg(conn, {**hello, "auth": answer is not None})
            if answer is not None:
                wire.recv_header(conn)
                wire.send_msg(conn, answer)
            conn.recv(1000)

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname(), listener


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ({"ok": True, "mac": "0" * 64}, "could not prove it holds the job's secret"),
        ({"ok": True}, "could not prove"),
        (None, "does not authenticate; refusing to trust its replicas"),
    ],
)
def test_a_client_trusts_only_a_server_that_proves_the_secret(
    answer: dict[str, object] | None, why: str
) -> None:
    address, listener = _impostor(answer)
    try:
        client = ReplicaClient(*address, RUN, secret=SECRET, connect_timeout=2)
        with pytest.raises(ReplicaError, match=why):
            client.steps()
    finally:
        listener.close()


def test_connections_are_capped_per_peer_and_freed_when_closed(tmp_path: Path) -> None:
    srv = ReplicaServer(
        tmp_path / "srv", "127.0.0.1", free_port(), secret=SECRET, max_conns_per_peer=3
    ).start()
    try:
        held = [socket.create_connection(srv.address, timeout=10) for _ in range(3)]
        for s in held:
            assert wire.recv_header(s)["ok"]  # type: ignore[index]
        with socket.create_connection(srv.address, timeout=10) as extra:
            assert wire.recv_header(extra) == {"ok": False, "error": "too many connections"}
            assert extra.recv(10) == b"", "the refused connection is closed"
        with pytest.raises(ReplicaError, match="too many connections"):
            ReplicaClient(*srv.address, RUN, secret=SECRET).steps()
        held.pop().close()
        _wait_for(lambda: srv.connections().get("127.0.0.1") == 2, "the slot to be freed")
        client = ReplicaClient(*srv.address, RUN, secret=SECRET)
        assert client.steps() == {}
        client.close()
        for s in held:
            s.close()
    finally:
        srv.stop()


def test_a_silent_connection_is_dropped_after_the_authentication_timeout(tmp_path: Path) -> None:
    srv = ReplicaServer(
        tmp_path / "srv", "127.0.0.1", free_port(), secret=SECRET, auth_timeout=0.3
    ).start()
    try:
        with socket.create_connection(srv.address, timeout=10) as s:
            assert wire.recv_header(s) is not None
            assert s.recv(10) == b"", "closed by the server"
        _wait_for(lambda: srv.connections() == {}, "the slot to be freed")
    finally:
        srv.stop()


@pytest.mark.root
def test_a_put_larger_than_the_room_left_is_refused_before_its_body(small_tmpfs: Path) -> None:
    srv = ReplicaServer(small_tmpfs, "127.0.0.1", free_port(), secret=SECRET).start()
    try:
        client = ReplicaClient(*srv.address, RUN, secret=SECRET)
        with pytest.raises(ReplicaError, match=r"rank-00000.bin of step 1: 4194304 bytes refused"):
            client.put(1, "rank-00000.bin", np.zeros(4 << 20, dtype=np.uint8))
        with pytest.raises(ReplicaError, match=rf"{MAX_META + 1} bytes refused"):
            # the header alone: the server answers before any body would be read
            client._call({"op": "put", "step": 1, "name": "rank-00000.json", "size": MAX_META + 1})
        assert not [p for p in small_tmpfs.rglob("*") if p.is_file()]
        client.put(1, "rank-00000.bin", np.zeros(100 << 10, dtype=np.uint8))  # fits
        assert client.steps() == {1: set()}
        client.close()
    finally:
        srv.stop()


def test_a_standalone_server_with_the_jobs_secret_serves_every_run_of_the_job(
    tmp_path: Path,
) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET.decode() + "\n")
    port = free_port()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "hyperpod"),
            "checkpoint",
            "serve",
            "--dir",
            str(tmp_path / "b"),
            "--port",
            str(port),
            "--secret-file",
            str(secret_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = []
    try:
        for name in ("pretrain", "finetune"):
            ckpt = Checkpointer(
                tmp_path / name,
                memory_dir=tmp_path / "a",
                node="a",
                peers={"a": ("127.0.0.1", 1), "b": ("127.0.0.1", port)},
                secret=SECRET,
                peer_timeout=10,
            )
            runs.append(ckpt)
            value = {"w": np.full(8, float(len(runs)))}
            assert ckpt.save(len(runs), value).wait() == {
                "memory": "ok",
                "peer": "ok",
                "persistent": "ok",
            }
        shutil.rmtree(tmp_path / "a")  # node a lost its memory
        for i, ckpt in enumerate(runs, start=1):
            shutil.rmtree(ckpt.persistent_dir / f"step-{i:010d}")  # only the peer has it
            got = ckpt.load_latest()
            assert got is not None and got[0] == i and ckpt.last_restore is not None
            assert ckpt.last_restore.tier == "peer", "each run finds its own replicas"
            assert np.array_equal(got[1]["w"], np.full(8, float(i)))
    finally:
        for ckpt in runs:
            ckpt.close()
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert "Traceback" not in err
