"""The checkpoint's background threads yield the CPU to training."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer, ReplicaServer, _threads, identity, layout
from hyperpod_agent.checkpoint.replica import ReplicaClient

from .conftest import free_port


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_lower_priority_changes_only_the_calling_thread() -> None:
    before = _nice()
    seen: list[int] = []

    def worker() -> None:
        _threads.lower_priority(before + 3)
        _threads.lower_priority(before + 1)  # never lowers it back
        seen.append(_nice())

    t = threading.Thread(target=worker)
    t.start()
    t.join(timeout=10)
    assert seen == [before + 3]
    assert _nice() == before


def test_tier_writers_and_replica_server_run_below_the_training_thread(
    make_ckpt: Callable[..., Checkpointer],
    tiers: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    training = _nice()
    seen: dict[str, int] = {}
    real_write, real_put = layout.atomic_write, ReplicaClient.put

    def write(path: Path, chunks: Any, sync: bool = True) -> int:
        if path.name == layout.data_name(0) and tiers["persistent"] in path.parents:
            seen["persistent"] = _nice()
        return real_write(path, chunks, sync)

    def put(self: ReplicaClient, step: int, name: str, body: Any) -> None:
        seen.setdefault("peer", _nice())
        real_put(self, step, name, body)

    real_dispatch = ReplicaServer.dispatch

    def dispatch(self: ReplicaServer, sock: Any, header: dict[str, Any]) -> None:
        seen.setdefault("server", _nice())
        real_dispatch(self, sock, header)

    monkeypatch.setattr(layout, "atomic_write", write)
    monkeypatch.setattr(ReplicaClient, "put", put)
    monkeypatch.setattr(ReplicaServer, "dispatch", dispatch)
    # The peer knows the run's secret, as the run's own ranks read it from run.json.
    tiers["persistent"].mkdir()
    secret = identity.load_or_create(tiers["persistent"]).secret
    server = ReplicaServer(tmp_path / "peer-mem", "127.0.0.1", free_port(), secret=secret).start()
    try:
        ckpt = make_ckpt(node="a", peers={"a": ("127.0.0.1", 1), "b": server.address})
        ckpt.save(1, {"w": np.ones(1000, dtype=np.float32)}).wait(timeout=60)
    finally:
        server.stop()
    assert _nice() == training
    assert seen == {
        "persistent": max(training, _threads.DISK),
        "peer": max(training, _threads.NETWORK),
        "server": max(training, _threads.NETWORK),
    }
