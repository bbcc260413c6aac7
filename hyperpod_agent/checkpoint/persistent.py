"""The persistent tiers of a save: this rank's shard, then (rank 0) the step's commit.

A persistent tier is a directory (:class:`DirTier`, here) or an object store
(``s3tier.S3Tier``); both keep the same layout and the same rules.

A step may hold files of an earlier attempt at the same step (a job restored an older step
and saves this one again, or crashed half-way through it). Each of those files passes its
own checksum, so nothing in the files themselves tells a mix of two attempts from one save.
Hence:

- every rank's metadata names its run and its save (``<launch>.<n>``, identity.py);
- before writing, a rank removes its own metadata of the step, and rank 0 the step's old
  ``step.json``, so a crash half-way leaves the step uncommitted rather than vouched for;
- rank 0 commits only once every rank's metadata names *this* save, and ``step.json``
  records the save, so a restore refuses a rank's shard of any other save.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from hyperpod_agent.checkpoint import _threads, fastio, layout, metrics, restore
from hyperpod_agent.checkpoint._threads import lower_priority
from hyperpod_agent.checkpoint.balance import assign_owners
from hyperpod_agent.checkpoint.context import Context
from hyperpod_agent.checkpoint.errors import CheckpointError, CorruptShardError
from hyperpod_agent.checkpoint.staging import Progress
from hyperpod_agent.checkpoint.state import ALIGN, Leaf

log = logging.getLogger(__name__)

RESUME_FILE = "resume.json"
_NUMBER = re.compile(r"[0-9]{1,18}", re.ASCII)  # not isdigit(): it accepts digits int() refuses


@dataclass
class SaveJob:
    """One save as the durable tiers see it: the staged bytes and how to describe them."""

    step: int
    save: str
    skeleton: Any
    leaves: list[Leaf]
    buf: np.ndarray  # the staging buffer, filled as ``progress`` says
    metas: Future[list[dict[str, Any]]]  # the leaves' entries with checksums, once computed
    times: dict[str, float]
    progress: Progress


@dataclass
class Placement:
    """Where this rank's leaves go in its persistent file.

    A replicated leaf assigned to another rank is not stored here (balance.py); the others
    are packed at aligned offsets, exactly as in the staging buffer when the rank owns them
    all, so that the buffer itself can be written (or uploaded) without a copy.
    """

    offsets: list[int | None]  # offset in this rank's file, None if another rank's leaf
    owners: dict[str, int]
    size: int
    whole: bool  # the file is the staging buffer as it is

    def entries(self, leaves: list[Leaf], metas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The metadata entries of this rank's file."""
        out: list[dict[str, Any]] = []
        for leaf, e, at in zip(leaves, metas, self.offsets, strict=True):
            if at is None:
                out.append(leaf.describe() | {"owner": self.owners[leaf.path]})
            else:
                out.append({**e, "offset": at})
        return out

    def chunks(self, job: SaveJob, follow: bool) -> Iterator[memoryview]:
        """The file's bytes as views of the staging buffer (zeros between leaves); with
        ``follow``, each leaf as soon as it is staged."""
        if not follow:
            job.progress.wait(len(job.buf))
        at = 0
        for leaf, where in zip(job.leaves, self.offsets, strict=True):
            if where is None:
                continue
            if where > at:
                yield memoryview(bytes(where - at))
            job.progress.wait(leaf.offset + leaf.nbytes)
            yield job.buf[leaf.offset : leaf.offset + leaf.nbytes].data
            at = where + leaf.nbytes


def place(ck: Context, leaves: list[Leaf]) -> Placement:
    """This rank's placement of ``leaves`` (every rank computes the same owners)."""
    owners = assign_owners(leaves, ck.replicated, ck.replica_group)
    offsets: list[int | None] = []
    pos = 0
    for leaf in leaves:
        if owners.get(leaf.path, ck.rank) != ck.rank:
            offsets.append(None)
            continue
        pos += -pos % ALIGN
        offsets.append(pos)
        pos += leaf.nbytes
    whole = all(at == leaf.offset for at, leaf in zip(offsets, leaves, strict=True))
    return Placement(offsets, owners, pos, whole)


def manifest(ck: Context, step: int, save: str) -> dict[str, Any]:
    """The step metadata rank 0 writes last: the commit of one save."""
    return {
        "format": layout.FORMAT,
        "step": step,
        "world_size": ck.world_size,
        "checksum": layout.CHECKSUM,
        "run": ck.run.run,
        "save": save,
        "created": time.time(),
    }


def resume_doc(step: int) -> dict[str, Any]:
    """``resume.json``: the step a (requeued) job resumed from (docs/auto-resume.md)."""
    doc: dict[str, Any] = {
        "step": int(step),
        "at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }
    for key, var in (("restart_count", "SLURM_RESTART_COUNT"), ("job_id", "SLURM_JOB_ID")):
        value = os.environ.get(var, "")
        if _NUMBER.fullmatch(value):
            doc[key] = int(value)
    return doc


def await_ranks(
    ck: Context,
    step: int,
    save: str,
    versions: Callable[[], dict[int, Hashable]],
    read: Callable[[int], dict[str, Any]],
    interval: float = 0.05,
    max_interval: float = 0.05,
    gone: Callable[[set[int]], set[int]] | None = None,
) -> None:
    """Block until every rank's metadata of ``step`` names this save, or raise after
    ``commit_timeout`` naming the ranks missing (and those holding another save's file).

    ``versions()`` lists the metadata present now, rank -> a token that changes when the
    file is replaced; ``read(rank)`` reads one. Only new or replaced files are read.
    ``gone(pending)``, if given, tells which of the pending ranks will never write this
    step (they moved on to a newer one): waiting for them is given up at once.
    """
    deadline = time.monotonic() + ck.commit_timeout
    pending = set(range(ck.world_size))
    other: set[int] = set()  # ranks whose file there is of another save
    seen: dict[int, Hashable] = {}
    while True:
        for r, token in versions().items():
            if r not in pending or (seen.get(r) == token and r not in other):
                # Done, or read before and not replaced since. A file of another save is
                # read again every time: a store whose listing has no ETag and coarse
                # times could show its replacement with the same token.
                continue
            seen[r] = token
            try:
                meta = read(r)
            except CorruptShardError:
                continue
            if meta.get("run") == ck.run.run and meta.get("save") == save:
                pending.discard(r)
                other.discard(r)
            else:
                other.add(r)
        if not pending:
            return
        skipped = sorted(gone(pending)) if gone is not None else []
        if skipped:
            raise CheckpointError(
                f"step {step}: ranks {skipped} moved on to a newer step without writing this "
                "one: not committed"
            )
        if time.monotonic() >= deadline:
            have = sorted(set(range(ck.world_size)) - pending)
            stale = f" (ranks {sorted(other)} hold files of another save)" if other else ""
            raise CheckpointError(
                f"step {step}: only ranks {have} of {ck.world_size} reached the "
                f"persistent tier within {ck.commit_timeout:g} s{stale}"
            )
        time.sleep(interval)
        interval = min(max_interval, interval * 1.5)


@dataclass
class TierView:
    """What a persistent tier holds, read once per restore."""

    committed: set[int]
    source: restore.Source


class PersistentTier:
    """A tier every rank writes its shard to and rank 0 commits; see the module docstring."""

    name: str = "persistent"  # in save handles, restores, logs and metrics
    location: str = ""  # where, for messages
    every: int = 1  # written on every ``every``-th save of the process
    nice: int = _threads.DISK  # CPU priority of the writer
    detach: bool = False  # the upload may run on after its save (uploads.py)

    def write(self, ck: Context, job: SaveJob) -> None:
        """Write this rank's shard of ``job.step``; rank 0 then commits it and applies
        retention."""
        raise NotImplementedError

    def view(self, ck: Context) -> TierView:
        """The committed steps and a source to read them (raises CheckpointStorageError if
        the tier cannot be listed)."""
        raise NotImplementedError

    def note_resume(self, step: int) -> None:
        """Record the step a job resumed from (best effort: never raises)."""

    def close(self) -> None:
        """Release connections."""


class DirTier(PersistentTier):
    """The persistent tier in a directory of a shared file system."""

    def __init__(self, root: Path, every: int = 1, direct: bool = True):
        self.root, self.every, self.location = root, every, str(root)
        self.direct = direct  # O_DIRECT for a rank's file that is its staging buffer

    def write(self, ck: Context, job: SaveJob) -> None:
        lower_priority(self.nice)
        d = layout.step_dir(self.root, job.step)
        if ck.rank == 0:
            (d / layout.STEP_META).unlink(missing_ok=True)
        (d / layout.meta_name(ck.rank)).unlink(missing_ok=True)
        where = place(ck, job.leaves)
        if not (where.whole and self._write_direct(ck, job, d / layout.data_name(ck.rank))):
            layout.atomic_write(d / layout.data_name(ck.rank), where.chunks(job, ck.overlap))
        stored = where.entries(job.leaves, job.metas.result())
        meta = ck.rank_meta(job.step, job.save, job.skeleton, stored, where.size)
        layout.write_json(d / layout.meta_name(ck.rank), meta)
        metrics.BYTES_WRITTEN.labels(self.name).inc(where.size)
        if ck.rank == 0:
            self._commit(ck, job.step, job.save)
            job.times[self.name] = time.perf_counter() - job.times["start"]
            layout.prune(self.root, ck.keep_persistent, committed=True)

    def _write_direct(self, ck: Context, job: SaveJob, path: Path) -> bool:
        """The staging buffer is the file: write it with O_DIRECT (fastio.py); False if
        this tier cannot (then not tried again)."""
        if not (self.direct and fastio.direct_capable(job.buf)):
            return False
        if not ck.overlap:
            job.progress.wait(len(job.buf))
        try:
            layout.direct_write(path, job.buf, job.progress.wait if ck.overlap else None)
        except fastio.DirectUnsupported as exc:
            log.info("persistent tier %s: %s; writing through the page cache", self.root, exc)
            self.direct = False
            return False
        return True

    def _commit(self, ck: Context, step: int, save: str) -> None:
        d = layout.step_dir(self.root, step)

        def versions() -> dict[int, Hashable]:
            out: dict[int, Hashable] = {}
            for r in range(ck.world_size):
                try:
                    st = os.stat(d / layout.meta_name(r))
                except FileNotFoundError:
                    continue
                out[r] = (st.st_ino, st.st_mtime_ns)
            return out

        await_ranks(ck, step, save, versions, lambda r: layout.read_json(d / layout.meta_name(r)))
        layout.write_json(d / layout.STEP_META, manifest(ck, step, save))

    def view(self, ck: Context) -> TierView:
        committed = {s for s, i in layout.scan(self.root).items() if i.committed}
        return TierView(committed, restore.DirSource(self.name, self.root, committed=True))

    def note_resume(self, step: int) -> None:
        path = self.root / RESUME_FILE
        tmp = path.with_name(f".{RESUME_FILE}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(resume_doc(step)) + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not record the resumed step in %s: %s", path, exc)
