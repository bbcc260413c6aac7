"""The background half of a save: write one staged save to every tier.

Checkpointer.save stages the state (checkpointer.py); the functions here run on its worker
thread and write the staged bytes to the memory tier, the successor's replica and the
durable tiers, each on its own thread, and record every tier's outcome for the SaveHandle.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hyperpod_agent.checkpoint import _threads, layout, metrics
from hyperpod_agent.checkpoint._threads import lower_priority
from hyperpod_agent.checkpoint.context import Context
from hyperpod_agent.checkpoint.errors import CheckpointError, CheckpointStorageError
from hyperpod_agent.checkpoint.persistent import PersistentTier, SaveJob
from hyperpod_agent.checkpoint.replica_client import ReplicaClient
from hyperpod_agent.checkpoint.staging import Progress, Slot, StagingAborted, StagingPool
from hyperpod_agent.checkpoint.state import Leaf
from hyperpod_agent.checkpoint.uploads import Plan, Uploads

log = logging.getLogger(__name__)


class Saver(Context, Protocol):
    """What the background half of a save reads of its checkpointer besides its tiers'
    context: the tiers, the memory tier and the replica to write, and the staging the save
    came from (private to the checkpointer, whose other half this module is)."""

    @property
    def tiers(self) -> Sequence[PersistentTier]: ...

    @property
    def memory_dir(self) -> Path | None: ...

    @property
    def keep_memory(self) -> int: ...

    @property
    def _replica(self) -> ReplicaClient | None:
        """The client of the successor's replica server, if the run has a successor."""

    @property
    def _pool(self) -> StagingPool: ...

    @property
    def _uploads(self) -> Uploads: ...


def write(
    ck: Saver,
    step: int,
    index: int,
    save: str,
    skeleton: Any,
    leaves: list[Leaf],
    size: int,
    times: dict[str, float],
    slot: Slot,
    progress: Progress,
    uploads: Plan,
) -> dict[str, str]:
    """Write save number ``index`` (of ``step``) to every tier due; return tier -> status."""
    lower_priority(_threads.DISK)
    buf = slot.array[:size]
    metas: Future[list[dict[str, Any]]] = Future()
    tiers: dict[str, str] = {}
    jobs: list[tuple[str, Any]] = []
    if ck._replica is not None:
        jobs.append(
            (
                "peer",
                lambda: _write_peer(ck, step, save, buf, skeleton, metas, times, progress),
            )
        )
    job = SaveJob(step, save, skeleton, leaves, buf, metas, times, progress)
    for tier in ck.tiers:
        plan = uploads.get(tier.name)
        if isinstance(plan, str):
            tiers[tier.name] = plan  # skipped
        elif isinstance(plan, Future):
            _start_upload(ck, tier, job, slot, tiers, plan)
        elif index % tier.every == 0:
            jobs.append((tier.name, lambda t=tier: t.write(ck, job)))
    # The data files need no checksums, so every tier starts writing as soon as its bytes
    # are staged and takes the checksums (computed here meanwhile) for the metadata it
    # writes last. Network, disk and memory are different bottlenecks, and copies,
    # sendall, write, fsync and crc32 all release the GIL.
    threads = [
        threading.Thread(
            target=_tier,
            args=(ck, tiers, name, fn, times),
            name=f"hyperpod-ckpt-{name}",
            daemon=True,
        )
        for name, fn in jobs
    ]
    for t in threads:
        t.start()
    try:
        if not ck.overlap:
            progress.wait(size)  # on a small host, checksumming alongside slows the copy
        entries = []
        for leaf in leaves:
            progress.wait(leaf.offset + leaf.nbytes)
            crc = layout.checksum(buf[leaf.offset : leaf.offset + leaf.nbytes])
            entries.append({**leaf.describe(), "offset": leaf.offset, "crc32": crc})
    except BaseException as exc:
        metas.set_exception(exc)  # the tier threads waiting for it fail instead of hanging
        for t in threads:
            t.join()
        ck._pool.forget(slot)
        if isinstance(exc, StagingAborted):
            mem = ("memory",) if ck.memory_dir is not None else ()
            return {name: str(exc) for name in (*mem, *tiers)}
        raise  # pragma: no cover - crc32 of a mapped buffer
    metas.set_result(entries)
    if ck.memory_dir is not None:
        meta = ck.rank_meta(step, save, skeleton, entries, size)
        _tier(ck, tiers, "memory", lambda: _write_memory(ck, step, slot, meta, times), times)
    for t in threads:
        t.join()
    if slot.mapped:
        ck._pool.prepare(size)
    return tiers


def _start_upload(
    ck: Saver,
    tier: PersistentTier,
    job: SaveJob,
    slot: Slot,
    tiers: dict[str, str],
    done: Future[None],
) -> None:
    """``tier``'s write of ``job`` on after the save (uploads.py)."""

    def run() -> None:
        _tier(ck, tiers, tier.name, lambda: tier.write(ck, job), job.times)

    def skip(why: str) -> None:
        tiers[tier.name] = why

    ck._uploads.start(tier, slot, run, skip, done)


def _tier(ck: Saver, tiers: dict[str, str], name: str, fn: Any, times: dict[str, float]) -> None:
    try:
        fn()
        tiers[name] = "ok"
    except Exception as exc:
        # One tier failing must not stop the others: a full /dev/shm still leaves the
        # persistent copy, and a dead peer still leaves the local one. The failure is
        # reported through the save handle.
        unexpected = not isinstance(exc, OSError | CheckpointError)
        log.warning("rank %d: %s tier write failed: %s", ck.rank, name, exc, exc_info=unexpected)
        metrics.TIER_FAILURES.labels(name).inc()
        tiers[name] = str(exc) or type(exc).__name__
    # A tier that reached its durable point stamped it already (retention runs after).
    times.setdefault(name, time.perf_counter() - times["start"])


def _write_memory(
    ck: Saver, step: int, slot: Slot, meta: dict[str, Any], times: dict[str, float]
) -> None:
    if not slot.mapped or ck.memory_dir is None:
        raise CheckpointStorageError(slot.error or "memory tier unavailable")
    d = layout.step_dir(ck.memory_dir, step)
    d.mkdir(exist_ok=True)  # inside the run's own directory, never its parents
    # A stale metadata file of an earlier attempt at this step must not vouch for the
    # new data while it is being renamed in.
    (d / layout.meta_name(ck.rank)).unlink(missing_ok=True)
    try:
        ck._pool.publish(slot, step, d / layout.data_name(ck.rank))
    except OSError:
        ck._pool.forget(slot)
        raise
    layout.write_json(d / layout.meta_name(ck.rank), meta)
    times["memory"] = time.perf_counter() - times["start"]
    metrics.BYTES_WRITTEN.labels("memory").inc(meta["data_size"])
    for old in layout.prunable(ck.memory_dir, ck.keep_memory, [ck.rank]):
        d_old = layout.step_dir(ck.memory_dir, old)
        (d_old / layout.meta_name(ck.rank)).unlink(missing_ok=True)
        ck._pool.retire(old)
        layout.remove_step(ck.memory_dir, old, [ck.rank])


def _write_peer(
    ck: Saver,
    step: int,
    save: str,
    data: np.ndarray,
    skeleton: Any,
    metas: Future[list[dict[str, Any]]],
    times: dict[str, float],
    progress: Progress,
) -> None:
    assert ck._replica is not None
    lower_priority(_threads.NETWORK)
    progress.wait(data.size)  # the network is not the bottleneck of durability: send whole
    ck._replica.put(step, layout.data_name(ck.rank), data)
    meta = ck.rank_meta(step, save, skeleton, metas.result(), data.size)
    ck._replica.put(
        step, layout.meta_name(ck.rank), json.dumps(meta, separators=(",", ":")).encode()
    )
    times["peer"] = time.perf_counter() - times["start"]
    metrics.BYTES_WRITTEN.labels("peer").inc(data.nbytes)
    ck._replica.prune([ck.rank], ck.keep_memory)
