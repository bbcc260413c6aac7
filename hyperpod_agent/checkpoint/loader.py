"""Restore: find the newest step complete for every rank and read this rank's shard of it."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from hyperpod_agent.checkpoint import _torch, layout, metrics, restore
from hyperpod_agent.checkpoint.context import Context
from hyperpod_agent.checkpoint.errors import (
    CheckpointError,
    CheckpointStorageError,
    CorruptShardError,
    ReplicaError,
)
from hyperpod_agent.checkpoint.persistent import PersistentTier, TierView
from hyperpod_agent.checkpoint.replica_client import ReplicaClient

log = logging.getLogger(__name__)


class Restorer(Context, Protocol):
    """What a restore reads of its checkpointer, besides the context its tiers need: where
    the fast tiers are and how to reach the peers; it records how the restore went."""

    last_restore: restore.RestoreInfo | None

    @property
    def tiers(self) -> Sequence[PersistentTier]: ...

    @property
    def memory_dir(self) -> Path | None: ...

    @property
    def node(self) -> str: ...

    @property
    def peers(self) -> Mapping[str, tuple[str, int]]: ...

    @property
    def peer_timeout(self) -> float: ...

    @property
    def peer_streams(self) -> int: ...

    @property
    def secret(self) -> bytes: ...


PeerViews = list[tuple[restore.PeerSource, dict[int, set[int]]]]
_NONE = layout.StepInfo(-1)


def _peer_views(ck: Restorer) -> PeerViews:
    out = []
    for node in sorted(ck.peers):
        if node == ck.node:
            continue  # our own server serves the memory directory we read directly
        host, port = ck.peers[node]
        client = ReplicaClient(
            host,
            port,
            ck.run.namespace,
            node=node,
            timeout=ck.peer_timeout,
            connect_timeout=min(3.0, ck.peer_timeout),
            secret=ck.secret,
        )
        try:
            src = restore.PeerSource(node, client, ck.peer_streams, run=ck.run.run)
            out.append((src, client.steps()))
        except ReplicaError as exc:
            log.warning("rank %d: peer %s not consulted: %s", ck.rank, node, exc)
            client.close()
    return out


def _durable_views(ck: Restorer) -> list[TierView]:
    out = []
    for tier in ck.tiers:
        try:
            out.append(tier.view(ck))
        except CheckpointStorageError as exc:
            # An object store that cannot be reached must not stop a restore the fast
            # tiers (or another durable tier) can still make.
            log.warning("rank %d: %s tier not consulted: %s", ck.rank, tier.name, exc)
    return out


class _Views:
    """What every tier holds, listed once per restore."""

    def __init__(self, ck: Restorer):
        self.local = layout.scan(ck.memory_dir) if ck.memory_dir is not None else {}
        self.peers = _peer_views(ck)
        self.durable = _durable_views(ck)

    def candidates(self, world_size: int) -> list[int]:
        """Steps complete in the fast tiers (all nodes together) or committed, newest first."""
        fast: dict[int, set[int]] = {s: set(i.ranks) for s, i in self.local.items()}
        for _, view in self.peers:
            for s, ranks in view.items():
                fast.setdefault(s, set()).update(ranks)
        everyone = set(range(world_size))
        steps = {s for s, r in fast.items() if r >= everyone}
        for v in self.durable:
            steps |= v.committed
        return sorted(steps, reverse=True)

    def sources(self, ck: Restorer, step: int) -> list[restore.Source]:
        """Where this rank's shard of ``step`` can be read, fastest first."""
        out: list[restore.Source] = []
        if ck.memory_dir is not None and ck.rank in self.local.get(step, _NONE).ranks:
            out.append(restore.DirSource("memory", ck.memory_dir, run=ck.run.run))
        out += [src for src, view in self.peers if ck.rank in view.get(step, ())]
        out += [v.source for v in self.durable if step in v.committed]
        return out

    def close(self) -> None:
        for src, _ in self.peers:
            src.client.close()


def _try_step(
    ck: Restorer, views: _Views, step: int, template: Any, fallbacks: list[str]
) -> tuple[bool, Any]:
    for src in views.sources(ck, step):
        try:
            value = restore.read_state(src, step, ck.rank, ck.world_size, template)
        except (CorruptShardError, ReplicaError, CheckpointStorageError) as exc:
            # CheckpointStorageError: an object store that fails mid-restore (unreachable,
            # throttled): the next source may still have the shard.
            why = f"step {step} rank {ck.rank}: {src.tier} tier: {exc}"
            log.warning("%s; trying the next source", why)
            metrics.FALLBACKS.labels(src.tier).inc()
            fallbacks.append(why)
            continue
        where = getattr(src, "node", None) or str(getattr(src, "root", ""))
        ck.last_restore = restore.RestoreInfo(step, src.tier, where, fallbacks)
        metrics.RESTORES.labels(src.tier).inc()
        log.info("rank %d: restored step %d from the %s tier (%s)", ck.rank, step, src.tier, where)
        return True, value
    return False, None


def load_step(ck: Restorer, step: int, template: Any = None) -> Any:
    """Restore ``step`` or raise CheckpointError saying what was tried."""
    views = _Views(ck)
    fallbacks: list[str] = []
    try:
        ok, value = _try_step(ck, views, step, template, fallbacks)
    finally:
        views.close()
    if not ok:
        tried = "; ".join(fallbacks) or "no tier holds it"
        raise CheckpointError(f"step {step} rank {ck.rank}: cannot be restored: {tried}")
    return value


def load_latest(ck: Restorer, template: Any, agree: bool | None) -> tuple[int, Any] | None:
    """See ``Checkpointer.load_latest``."""
    views = _Views(ck)
    fallbacks: list[str] = []
    found: tuple[int, Any] | None = None
    try:
        for step in views.candidates(ck.world_size):
            ok, value = _try_step(ck, views, step, template, fallbacks)
            if ok:
                found = (step, value)
                break
    finally:
        views.close()
    if found is None:
        ck.last_restore = None
    if agree is None:
        agree = ck.world_size > 1 and _dist_ready()
    if not agree:
        return found
    agreed = _all_min(found[0] if found else -1)
    if found is not None and agreed == found[0]:
        return found
    if agreed < 0:
        log.warning("rank %d: another rank has no restorable step; starting fresh", ck.rank)
        ck.last_restore = None
        return None
    log.warning("rank %d: restoring step %d, the newest every rank can restore", ck.rank, agreed)
    return agreed, load_step(ck, agreed, template)


def _dist_ready() -> bool:
    if not _torch.torch_loaded():
        return False
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def _all_min(value: int) -> int:
    import torch
    import torch.distributed as dist

    device = "cpu"
    if dist.get_backend() == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())
