"""Peer replica tier: two nodes on loopback, each hosting a replica server."""

from __future__ import annotations

import shutil
import socket
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer, ReplicaError, ReplicaServer, layout
from hyperpod_agent.checkpoint.replica import ReplicaClient

from .conftest import assert_same, free_port, sample_state

RUN = "0123456789abcdef" * 2  # a run's namespace on the server
SECRET = b"a secret of the job, 32 bytes..."


def _wipe(path: Path) -> None:
    shutil.rmtree(path)
    path.mkdir()


def _two_nodes(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path], **kw: object
) -> tuple[Checkpointer, Checkpointer]:
    peers = {"node1": ("127.0.0.1", free_port()), "node2": ("127.0.0.1", free_port())}
    a = make_ckpt(
        rank=0, world_size=2, node="node1", peers=peers, serve=True, memory_dir=tiers["mem1"], **kw
    )
    b = make_ckpt(
        rank=1, world_size=2, node="node2", peers=peers, serve=True, memory_dir=tiers["mem2"], **kw
    )
    return a, b


def _save_both(a: Checkpointer, b: Checkpointer, step: int) -> None:
    ha = a.save(step, sample_state(step))
    hb = b.save(step, sample_state(step + 100))
    assert ha.wait(timeout=60) == {"memory": "ok", "peer": "ok", "persistent": "ok"}
    hb.wait(timeout=60)


def test_successor_is_next_node_in_sorted_order(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    a, b = _two_nodes(make_ckpt, tiers)
    assert a.successor() == "node2" and b.successor() == "node1"


def test_each_node_holds_its_predecessors_shards(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    a, b = _two_nodes(make_ckpt, tiers)
    _save_both(a, b, 1)
    assert a.memory_dir is not None and b.memory_dir is not None
    assert layout.scan(a.memory_dir)[1].ranks == {0, 1}
    assert layout.scan(b.memory_dir)[1].ranks == {0, 1}


def test_wiped_memory_restores_from_peer(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    a, b = _two_nodes(make_ckpt, tiers)
    _save_both(a, b, 1)
    _wipe(tiers["mem1"])
    got = a.load_latest()
    assert got is not None and got[0] == 1
    assert_same(sample_state(1), got[1])
    assert a.last_restore is not None and a.last_restore.tier == "peer"
    assert a.last_restore.source == "node2"
    got_b = b.load_latest()
    assert got_b is not None and b.last_restore is not None
    assert b.last_restore.tier == "memory"
    assert_same(sample_state(101), got_b[1])


def test_all_memory_wiped_restores_from_persistent(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    a, b = _two_nodes(make_ckpt, tiers)
    _save_both(a, b, 1)
    _wipe(tiers["mem1"])
    _wipe(tiers["mem2"])
    for ckpt, expected in ((a, sample_state(1)), (b, sample_state(101))):
        got = ckpt.load_latest()
        assert got is not None and got[0] == 1
        assert ckpt.last_restore is not None and ckpt.last_restore.tier == "persistent"
        assert_same(expected, got[1])


def test_newer_fast_step_wins_over_older_persistent(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    a, b = _two_nodes(make_ckpt, tiers, persistent_every=2)
    _save_both(a, b, 1)  # persistent
    ha, hb = a.save(2, sample_state(2)), b.save(2, sample_state(102))
    assert ha.wait(timeout=60) == {"memory": "ok", "peer": "ok"}
    hb.wait(timeout=60)
    _wipe(tiers["mem2"])
    got = b.load_latest()
    assert got is not None and got[0] == 2 and b.last_restore is not None
    assert b.last_restore.tier == "peer"


def test_dead_peer_is_a_tier_failure_not_a_crash(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    peers = {"node1": ("127.0.0.1", free_port()), "node2": ("127.0.0.1", free_port())}
    a = make_ckpt(rank=0, world_size=1, node="node1", peers=peers, serve=True, peer_timeout=1.0)
    a._replica.connect_timeout = 0.5  # type: ignore[union-attr]
    with pytest.raises(Exception, match=r"peer tier failed: peer node2 .*couldn't connect"):
        a.save(1, {"x": np.ones(3)}).wait(timeout=30)
    got = a.load_latest()
    assert got is not None and got[0] == 1


def test_server_rejects_bad_requests_and_keeps_serving(tmp_path: Path) -> None:
    server = ReplicaServer(tmp_path / "srv", "127.0.0.1", free_port()).start()
    host, port = server.address
    try:
        client = ReplicaClient(host, port, RUN)
        with pytest.raises(ReplicaError, match=r"bad shard name '../../etc/passwd'"):
            client.put(1, "../../etc/passwd", b"x")
        client.close()
        with pytest.raises(ReplicaError, match=r"unknown op 'boom'"):
            client._call({"op": "boom"})
        client.close()
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(struct.pack(">I", 1 << 30))  # absurd header length
            s.recv(1000)
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(b"\x00\x00\x00\x05nope!")
            s.recv(1000)
        with pytest.raises(ReplicaError, match="not here"):
            client.get(3, "rank-00000.bin")
        client.put(3, "rank-00000.bin", b"abc")
        assert client.get(3, "rank-00000.bin").tobytes() == b"abc"
        assert client.steps() == {3: set()}
        assert not list((tmp_path / "srv").rglob("passwd"))
        client.close()
    finally:
        server.stop()


def test_server_port_in_use_is_a_precise_error(tmp_path: Path) -> None:
    server = ReplicaServer(tmp_path / "a", "127.0.0.1", free_port())
    try:
        with pytest.raises(ReplicaError, match=r"couldn't listen on 127.0.0.1:\d+"):
            ReplicaServer(tmp_path / "b", "127.0.0.1", server.address[1])
    finally:
        server.stop()


def test_peer_retention_prunes_only_the_pushing_ranks(tmp_path: Path) -> None:
    server = ReplicaServer(tmp_path / "srv", "127.0.0.1", free_port()).start()
    client = ReplicaClient(*server.address, RUN)
    try:
        for step in (1, 2, 3):
            for rank in (0, 1):
                client.put(step, layout.data_name(rank), b"d")
                client.put(step, layout.meta_name(rank), b"{}")
        assert client.prune([0], keep=1) == [1, 2]
        assert client.steps() == {1: {1}, 2: {1}, 3: {0, 1}}
    finally:
        client.close()
        server.stop()


def test_parallel_fetch_is_bit_exact_and_checks_the_file_size(tmp_path: Path) -> None:
    server = ReplicaServer(tmp_path / "srv", "127.0.0.1", free_port()).start()
    client = ReplicaClient(*server.address, RUN, node="node2")
    body = np.random.default_rng(7).integers(0, 256, (48 << 20) + 12345, dtype=np.uint8)
    try:
        client.put(5, "rank-00001.bin", body)
        for streams in (1, 2, 3, 8):
            got = client.fetch(5, "rank-00001.bin", body.size, streams)
            assert np.array_equal(got, body), f"{streams} streams"
        # two streams: whichever answers first refuses it, the one asking past the end
        # ("range ... beyond") or the file's size check ("holds N bytes"), never data
        too_long = r"rank-00001.bin of step 5(: range .* beyond| holds \d+ bytes, its metadata)"
        with pytest.raises(ReplicaError, match=too_long):
            client.fetch(5, "rank-00001.bin", body.size + 1, 2)
        with pytest.raises(ReplicaError, match=r"holds \d+ bytes, its metadata says \d+"):
            client.fetch(5, "rank-00001.bin", body.size - 1, 2)
        # the connection is usable again after a refused request
        assert client.fetch(5, "rank-00001.bin", body.size, 1).size == body.size
    finally:
        client.close()
        server.stop()


@pytest.mark.parametrize(
    "header",
    [
        {"offset": -1, "length": 1},
        {"offset": 0, "length": "all"},
        {"offset": True, "length": 1},
        {"length": 1},
        {"offset": 2, "length": 2},
    ],
)
def test_bad_ranges_are_refused_and_the_server_goes_on(
    tmp_path: Path, header: dict[str, object]
) -> None:
    server = ReplicaServer(tmp_path / "srv", "127.0.0.1", free_port()).start()
    client = ReplicaClient(*server.address, RUN)
    try:
        client.put(1, "rank-00000.bin", b"abc")
        with pytest.raises(ReplicaError, match=r"bad offset|bad length|beyond its 3 bytes"):
            client._call({"op": "get", "step": 1, "name": "rank-00000.bin", **header})
        client.close()
        assert client.get(1, "rank-00000.bin").tobytes() == b"abc"
    finally:
        client.close()
        server.stop()


def test_restore_from_peer_over_several_streams(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    a, b = _two_nodes(make_ckpt, tiers, peer_streams=3)
    big = {"w": np.random.default_rng(3).standard_normal(10 << 20).astype(np.float32)}
    ha, hb = a.save(1, big), b.save(1, big)
    ha.wait(timeout=60)
    hb.wait(timeout=60)
    _wipe(tiers["mem1"])
    got = a.load_latest(big)
    assert got is not None and a.last_restore is not None and a.last_restore.tier == "peer"
    assert_same(got[1], big)


def test_a_server_with_a_secret_serves_only_clients_that_prove_it(tmp_path: Path) -> None:
    server = ReplicaServer(tmp_path / "srv", "127.0.0.1", free_port(), secret=SECRET).start()
    try:
        good = ReplicaClient(*server.address, RUN, secret=SECRET)
        good.put(1, "rank-00000.bin", b"abc")
        for bad, why in (
            (ReplicaClient(*server.address, RUN), "requires the job's secret"),
            (ReplicaClient(*server.address, RUN, secret=b"n" * 16), "unauthorized: wrong secret"),
        ):
            with pytest.raises(ReplicaError, match=why):
                bad.get(1, "rank-00000.bin")
            with pytest.raises(ReplicaError, match=why):
                bad.put(1, "rank-00000.bin", np.zeros(64 << 20, dtype=np.uint8))
            bad.close()
        assert good.fetch(1, "rank-00000.bin", 3, 2).tobytes() == b"abc"
        good.close()
    finally:
        server.stop()


def test_job_with_a_secret_replicates_and_restores_from_the_peer(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    a, b = _two_nodes(make_ckpt, tiers, secret="per-job-secret-0123456789")
    _save_both(a, b, 1)
    assert a.server is not None and a.server.secret == b"per-job-secret-0123456789"
    _wipe(tiers["mem1"])
    got = a.load_latest(sample_state(1))
    assert got is not None and a.last_restore is not None and a.last_restore.tier == "peer"
    assert_same(got[1], sample_state(1))
