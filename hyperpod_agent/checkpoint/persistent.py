"""The persistent tier of a save: this rank's shard, then (rank 0) the step's commit.

A step directory may hold files of an earlier attempt at the same step (a job restored an
older step and saves this one again, or crashed half-way through it). Each of those files
passes its own checksum, so nothing in the files themselves tells a mix of two attempts
from one save. Hence:

- every rank's metadata names its run and its save (``<launch>.<n>``, identity.py);
- before writing, a rank removes its own metadata of the step, and rank 0 the step's old
  ``step.json``, so a crash half-way leaves the step uncommitted rather than vouched for;
- rank 0 commits only once every rank's metadata names *this* save, and ``step.json``
  records the save, so a restore refuses a rank's shard of any other save.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from hyperpod_agent.checkpoint import layout, metrics
from hyperpod_agent.checkpoint.balance import assign_owners
from hyperpod_agent.checkpoint.errors import CheckpointError, CorruptShardError
from hyperpod_agent.checkpoint.staging import Progress
from hyperpod_agent.checkpoint.state import ALIGN, Leaf

if TYPE_CHECKING:
    from hyperpod_agent.checkpoint.checkpointer import Checkpointer


def write(
    ck: Checkpointer,
    step: int,
    save: str,
    skeleton: Any,
    leaves: list[Leaf],
    buf: np.ndarray,
    metas: Future[list[dict[str, Any]]],
    times: dict[str, float],
    progress: Progress,
) -> None:
    """Write this rank's shard of ``step``; rank 0 then commits it and applies retention."""
    d = layout.step_dir(ck.persistent_dir, step)
    if ck.rank == 0:
        (d / layout.STEP_META).unlink(missing_ok=True)
    (d / layout.meta_name(ck.rank)).unlink(missing_ok=True)
    owners = assign_owners(leaves, ck.replicated, ck.replica_group)
    placed: list[int | None] = []  # offset in this rank's file, None if another rank's
    pos = 0
    for leaf in leaves:
        if owners.get(leaf.path, ck.rank) != ck.rank:
            placed.append(None)
            continue
        pos += -pos % ALIGN
        placed.append(pos)
        pos += leaf.nbytes

    def chunks() -> Iterator[memoryview]:
        if not ck.overlap:
            progress.wait(len(buf))
        at = 0
        for leaf, where in zip(leaves, placed, strict=True):
            if where is None:
                continue
            if where > at:
                yield memoryview(bytes(where - at))
            progress.wait(leaf.offset + leaf.nbytes)  # written as soon as it is staged
            yield buf[leaf.offset : leaf.offset + leaf.nbytes].data
            at = where + leaf.nbytes

    layout.atomic_write(d / layout.data_name(ck.rank), chunks())
    stored: list[dict[str, Any]] = []
    for leaf, e, at in zip(leaves, metas.result(), placed, strict=True):
        if at is None:
            stored.append(leaf.describe() | {"owner": owners[leaf.path]})
        else:
            stored.append({**e, "offset": at})
    layout.write_json(
        d / layout.meta_name(ck.rank), ck.rank_meta(step, save, skeleton, stored, pos)
    )
    metrics.BYTES_WRITTEN.labels("persistent").inc(pos)
    if ck.rank == 0:
        commit(ck, step, save)
        times["persistent"] = time.perf_counter() - times["start"]
        layout.prune(ck.persistent_dir, ck.keep_persistent, committed=True)


def commit(ck: Checkpointer, step: int, save: str) -> None:
    """Rank 0 writes the step metadata once every rank's metadata names this save."""
    d = layout.step_dir(ck.persistent_dir, step)
    deadline = time.monotonic() + ck.commit_timeout
    pending = set(range(ck.world_size))
    other: set[int] = set()  # ranks whose file there is of another save
    seen: dict[int, tuple[int, int]] = {}
    while True:
        for r in sorted(pending):
            path = d / layout.meta_name(r)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            if seen.get(r) == (st.st_ino, st.st_mtime_ns):
                continue  # read before and not replaced since
            seen[r] = (st.st_ino, st.st_mtime_ns)
            try:
                meta = layout.read_json(path)
            except CorruptShardError:
                continue
            if meta.get("run") == ck.run.run and meta.get("save") == save:
                pending.discard(r)
                other.discard(r)
            else:
                other.add(r)
        if not pending:
            break
        if time.monotonic() >= deadline:
            have = sorted(set(range(ck.world_size)) - pending)
            stale = f" (ranks {sorted(other)} hold files of another save)" if other else ""
            raise CheckpointError(
                f"step {step}: only ranks {have} of {ck.world_size} reached the "
                f"persistent tier within {ck.commit_timeout:g} s{stale}"
            )
        time.sleep(0.05)
    layout.write_json(
        d / layout.STEP_META,
        {
            "format": layout.FORMAT,
            "step": step,
            "world_size": ck.world_size,
            "checksum": layout.CHECKSUM,
            "run": ck.run.run,
            "save": save,
            "created": time.time(),
        },
    )
