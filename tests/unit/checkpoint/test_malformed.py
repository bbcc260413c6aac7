"""Malformed metadata, or a peer's absurd answer, is a fallback with one line, never a crash."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer, ReplicaServer, layout, wire

from .conftest import assert_same, free_port, sample_state

Meta = dict[str, Any]


def _leaf(meta: Meta, path: str) -> dict[str, Any]:
    return next(e for e in meta["entries"] if e["path"] == path)


def _deep_json(meta: Meta) -> str:
    """The document with a skeleton nested deeper than any JSON parser recurses."""
    meta["skeleton"] = "DEEP"
    return json.dumps(meta).replace('"DEEP"', "[" * 100_000 + "]" * 100_000)


def _deep_skeleton(depth: int) -> Meta:
    node: Meta = {"t": "val", "v": None}
    for _ in range(depth):
        node = {"t": "list", "v": [node]}
    return node


# Each changes the metadata in place, or returns the text to write instead.
MUTATIONS: dict[str, Callable[[Meta], object]] = {
    "offset as a string": lambda m: _leaf(m, "model/w").update(offset="0"),
    "huge data_size": lambda m: m.update(data_size=10**15),
    "shape not matching nbytes": lambda m: _leaf(m, "model/w").update(shape=[10**12]),
    "negative dimension": lambda m: _leaf(m, "model/w").update(shape=[-16, -8]),
    "object dtype": lambda m: _leaf(m, "model/w").update(
        dtype='"|O"', nbytes=8 * 128, shape=[16, 8]
    ),
    "unparsable dtype": lambda m: _leaf(m, "model/w").update(dtype="not json"),
    "leaf index out of range": lambda m: m["skeleton"]["v"][0]["v"][0].update(i=99),
    "unknown skeleton node": lambda m: m["skeleton"].update(t="weird"),
    "entries not a list": lambda m: m.update(entries={"a": 1}),
    "world size as a string": lambda m: m.update(world_size="1"),
    "JSON nested too deep": _deep_json,
    "skeleton nested too deep": lambda m: m.update(skeleton=_deep_skeleton(300)),
    "owner out of range": lambda m: _leaf(m, "model/w").update(owner=7),
    "bytes with a wide dtype": lambda m: _leaf(m, "blob").update(dtype='"<f8"'),
    "leaf moved past its place": lambda m: _leaf(m, "model/b").update(offset=10**9),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_malformed_memory_metadata_falls_back_with_one_line(
    make_ckpt: Callable[..., Checkpointer],
    mutation: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ckpt = make_ckpt()
    ckpt.save(2, sample_state(2)).wait()
    assert ckpt.memory_dir is not None
    path = layout.step_dir(ckpt.memory_dir, 2) / layout.meta_name(0)
    meta = json.loads(path.read_text())
    text = MUTATIONS[mutation](meta)
    path.write_text(text if isinstance(text, str) else json.dumps(meta))
    for template in (None, sample_state(0)):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            got = ckpt.load_latest(template)
        assert got is not None and got[0] == 2
        assert ckpt.last_restore is not None and ckpt.last_restore.tier == "persistent"
        assert_same(got[1], sample_state(2))
        lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(lines) == 1 and str(path) in lines[0].getMessage(), caplog.text


class _LyingServer(ReplicaServer):
    """A peer whose answers to metadata requests announce an absurd size."""

    def dispatch(self, sock: socket.socket, header: dict[str, Any]) -> None:
        if header.get("op") == "get" and str(header.get("name", "")).endswith(".json"):
            wire.send_msg(sock, {"ok": True, "size": 10**15})
            return
        super().dispatch(sock, header)


def _peer_pair(
    tmp_path: Path, server_cls: type[ReplicaServer]
) -> tuple[Checkpointer, ReplicaServer]:
    """Node a (a checkpointer) whose successor b is a server of ``server_cls``."""
    persistent = tmp_path / "p"
    a_port = free_port()
    probe = Checkpointer(persistent, memory_dir=tmp_path / "probe")
    secret = probe.secret
    probe.close()
    server = server_cls(tmp_path / "b", "127.0.0.1", free_port(), secret=secret).start()
    ckpt = Checkpointer(
        persistent,
        memory_dir=tmp_path / "a",
        node="a",
        peers={"a": ("127.0.0.1", a_port), "b": server.address},
    )
    return ckpt, server


def test_a_peer_announcing_an_absurd_size_costs_a_fallback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt, server = _peer_pair(tmp_path, _LyingServer)
    try:
        assert ckpt.save(3, sample_state(3)).wait() == {
            "memory": "ok",
            "peer": "ok",
            "persistent": "ok",
        }
        assert ckpt.memory_dir is not None
        layout.remove_step(ckpt.memory_dir, 3)  # only the peer and the persistent tier have it
        with caplog.at_level(logging.WARNING):
            got = ckpt.load_latest()
        assert got is not None and got[0] == 3 and ckpt.last_restore is not None
        assert ckpt.last_restore.tier == "persistent"
        assert "sent 1000000000000000 bytes" in caplog.text
    finally:
        ckpt.close()
        server.stop()


def test_a_peer_shard_claiming_more_memory_than_the_node_has_costs_a_fallback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt, server = _peer_pair(tmp_path, ReplicaServer)
    try:
        ckpt.save(3, {"w": np.ones(4, dtype=np.float32)}).wait()
        assert ckpt.memory_dir is not None
        layout.remove_step(ckpt.memory_dir, 3)
        # The replica's metadata is self-consistent, and claims 4e13 bytes.
        replica = layout.step_dir(tmp_path / "b" / ckpt.run.dir_name, 3) / layout.meta_name(0)
        meta = json.loads(replica.read_text())
        meta["entries"][0].update(shape=[10**13], nbytes=4 * 10**13)
        meta["data_size"] = 4 * 10**13
        replica.write_text(json.dumps(meta))
        with caplog.at_level(logging.WARNING):
            got = ckpt.load_latest()
        assert got is not None and ckpt.last_restore is not None
        assert ckpt.last_restore.tier == "persistent"
        assert "claims 40000000000000 bytes, more than this node has free" in caplog.text
    finally:
        ckpt.close()
        server.stop()
