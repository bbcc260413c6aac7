"""The persistent tier in an S3-compatible object store (``s3://bucket/prefix``).

Either the persistent tier itself (``HYPERPOD_CHECKPOINT_DIR=s3://...``) or a second one
behind a filesystem tier (``HYPERPOD_CHECKPOINT_S3=s3://...``, written every M-th save).
Keys and guarantees are the filesystem tier's (s3layout.py): each rank uploads its data,
then its metadata (CRC-32 per leaf); rank 0 writes ``step.json`` once every rank's metadata
of this save is listed, which commits the step.

The run identity (identity.py) is the object ``run.json`` under the prefix. Without a
link or rename to settle a race, rank 0 creates it (``If-None-Match: *`` where the store
supports conditional writes, then read back) and the other ranks wait for it, bounded by
``commit_timeout``. Behind a filesystem tier, the directory's ``run.json`` is the run's
identity; rank 0 copies it to the store on its first upload, and a new directory adopts
the store's (the store outlives a scratch file system). A store holding another run's
identity is refused on upload, and its shards at restore.

Uploads go straight from the staging buffer in parallel parts (s3store.py) at the writer
thread's lowered CPU priority; restores read ranges in parallel into the restore buffer.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import numpy as np

from hyperpod_agent.checkpoint import _threads, identity, layout, metrics, restore, s3layout
from hyperpod_agent.checkpoint._threads import lower_priority
from hyperpod_agent.checkpoint.context import Context
from hyperpod_agent.checkpoint.errors import CheckpointStorageError, CorruptShardError
from hyperpod_agent.checkpoint.persistent import (
    RESUME_FILE,
    PersistentTier,
    SaveJob,
    TierView,
    await_ranks,
    manifest,
    place,
    resume_doc,
)
from hyperpod_agent.checkpoint.s3config import S3Location, S3Options
from hyperpod_agent.checkpoint.s3errors import S3Error, S3ObjectMissingError
from hyperpod_agent.checkpoint.s3store import S3Store
from hyperpod_agent.checkpoint.validate import fits_in_memory

log = logging.getLogger(__name__)

_STEP = re.compile(r"step-([0-9]{10})", re.ASCII)
_META = re.compile(r"rank-([0-9]{5})\.json", re.ASCII)
_NEWER = re.compile(r"step-([0-9]{10})/rank-([0-9]{5})\.json", re.ASCII)


def location_of(url: str) -> str:
    """``s3://bucket/prefix`` without a trailing slash: the tier's name in the run's
    namespace and in messages (``s3://b/p/`` and ``s3://b/p`` are one location)."""
    loc = S3Location.parse(url)
    return f"s3://{loc.bucket}/{loc.prefix}".rstrip("/")


class S3Tier(PersistentTier):
    """A persistent tier in an object store; see the module docstring."""

    # A slow or hung store must not hold the next save back: the upload runs on after
    # its save, from the pinned staging buffer (uploads.py).
    detach = True

    def __init__(
        self,
        url: str,
        options: S3Options | None = None,
        *,
        every: int = 1,
        name: str = "persistent",
        nice: int = _threads.DISK,
        mirror_of: Path | None = None,
    ):
        self.location = location_of(url)
        self.store = S3Store(url, options)
        self.every, self.name, self.nice = every, name, nice
        self.mirror_of = mirror_of  # the filesystem tier's run.json this store copies
        self._checked = False  # this process has seen the store's run.json name our run

    def uri(self, name: str) -> str:
        """``s3://bucket/prefix/name`` for messages."""
        return self.store.location.uri(name)

    # ---- identity -------------------------------------------------------------------------

    def _get_run(self) -> bytes | None:
        try:
            return self.store.get(identity.RUN_FILE)
        except S3ObjectMissingError:
            return None

    def load_identity(self, rank: int, job_key: str | None, timeout: float) -> identity.RunIdentity:
        """The run identity when this store is the persistent tier: rank 0 creates it on
        first use, the other ranks wait for it (up to ``timeout`` seconds)."""
        where = self.uri(identity.RUN_FILE)
        raw = self._get_run()
        if raw is None and rank == 0:
            self.store.put_if_absent(identity.RUN_FILE, identity.new_document(job_key))
            # Read back: on a store without conditional writes another writer may have won.
            raw = self._get_run()
        deadline = time.monotonic() + timeout
        delay = 0.05
        while raw is None:
            if time.monotonic() >= deadline:
                raise CheckpointStorageError(
                    f"{where}: rank 0 has not created the run identity within {timeout:g} s; "
                    "is rank 0 running, with the same HYPERPOD_CHECKPOINT_DIR?"
                )
            time.sleep(delay)
            delay = min(1.0, delay * 1.5)
            raw = self._get_run()
        return identity.identify(raw, where, self.location, job_key)

    def adopt(self, job_key: str | None) -> Callable[[], bytes | None]:
        """For a new filesystem directory in front of this store: the store's identity, if
        it has one (checked against the job key), so that the run goes on from the store's
        checkpoints. An unreachable store raises: whether to resume cannot be known."""

        def find() -> bytes | None:
            raw = self._get_run()
            if raw is not None:
                identity.identify(raw, self.uri(identity.RUN_FILE), self.location, job_key)
            return raw

        return find

    def _check_run(self, ck: Context) -> None:
        """Behind a filesystem tier: the store holds this run's identity (rank 0 copies
        it there first), never another run's."""
        if self.mirror_of is None or self._checked:
            return
        where = self.uri(identity.RUN_FILE)
        raw = self._get_run()
        if raw is None:
            if ck.rank != 0:
                return  # rank 0 copies it; until then there is nothing to disagree with
            self.store.put_if_absent(identity.RUN_FILE, self.mirror_of.read_bytes())
            raw = self._get_run()
            if raw is None:
                raise CheckpointStorageError(f"{where}: written, but not found when read back")
        run, _, _ = identity.parse(raw, where)
        if run != ck.run.run:
            raise CheckpointStorageError(
                f"{where}: this store holds the checkpoints of another run ({run}), not of this "
                f"one ({ck.run.run}, {self.mirror_of}); give each run its own S3 prefix"
            )
        self._checked = True

    # ---- save -----------------------------------------------------------------------------

    def write(self, ck: Context, job: SaveJob) -> None:
        lower_priority(self.nice)  # the part uploads run on threads that inherit it
        self._check_run(ck)
        pre = s3layout.step_prefix(job.step)
        if ck.rank == 0:  # in a request of its own, before anything of the step changes
            self.store.delete([pre + layout.STEP_META])
        self.store.delete([pre + layout.meta_name(ck.rank)])
        where = place(ck, job.leaves)
        data = pre + layout.data_name(ck.rank)
        if where.whole:
            # The object is the staging buffer: parts are views of it, sent as it fills.
            if not ck.overlap:
                job.progress.wait(len(job.buf))
            self.store.put(data, job.buf.data, ready=job.progress.wait if ck.overlap else None)
        else:
            # Another rank stores some replicated leaves: the object is this rank's leaves
            # and zeros between them; only parts spanning two of them are assembled.
            self.store.put(data, list(where.chunks(job, follow=False)))
        stored = where.entries(job.leaves, job.metas.result())
        meta = ck.rank_meta(job.step, job.save, job.skeleton, stored, where.size)
        self.store.put(pre + layout.meta_name(ck.rank), _json(meta))
        metrics.BYTES_WRITTEN.labels(self.name).inc(where.size)
        if ck.rank == 0:
            self._commit(ck, job.step, job.save)
            job.times[self.name] = time.perf_counter() - job.times["start"]
            s3layout.prune(self.store, ck.keep_persistent)

    def _commit(self, ck: Context, step: int, save: str) -> None:
        pre = s3layout.step_prefix(step)

        def versions() -> dict[int, Hashable]:
            out: dict[int, Hashable] = {}
            for o in self.store.list_objects(pre):
                m = _META.fullmatch(o.name[len(pre) :])
                if m:
                    out[int(m.group(1))] = (o.size, o.version)
            return out

        def read(r: int) -> dict[str, Any]:
            name = pre + layout.meta_name(r)
            return layout.parse_meta(self.store.get(name), self.uri(name))

        checked: dict[str, Hashable] = {}

        def gone(pending: set[int]) -> set[int]:
            # Uploads run one at a time per rank, in save order, and a rank skips a save
            # when its previous upload still runs (uploads.py): a pending rank whose
            # metadata of a newer step belongs to a later save of this launch will never
            # write this step. (Newer steps of an earlier launch are left alone.)
            out: set[int] = set()
            for o in self.store.list_objects("step-", after=pre + "~"):
                m = _NEWER.fullmatch(o.name)
                r = int(m.group(2)) if m else -1
                if r not in pending or r in out or checked.get(o.name) == o.version:
                    continue
                checked[o.name] = o.version
                try:
                    meta = layout.parse_meta(self.store.get(o.name), self.uri(o.name))
                except CorruptShardError:
                    continue
                if meta.get("run") == ck.run.run and _later(meta.get("save"), save):
                    out.add(r)
            return out

        # A listing is a request: poll gently (0.1 s, growing to 1 s), not every 50 ms.
        await_ranks(ck, step, save, versions, read, 0.1, 1.0, gone)
        s3layout.commit(self.store, step, manifest(ck, step, save))

    # ---- restore --------------------------------------------------------------------------

    def view(self, ck: Context) -> TierView:
        """The steps listed under the prefix and their manifests (one listing, one small
        read per step: retention keeps few); a newer step without one is logged once."""
        manifests: dict[int, bytes | None] = {}
        for name in self.store.list_dirs(""):
            m = _STEP.fullmatch(name)
            if not m:
                continue
            step = int(m.group(1))
            try:
                manifests[step] = self.store.get(s3layout.step_prefix(step) + layout.STEP_META)
            except S3ObjectMissingError:
                manifests[step] = None
        committed = {s for s, raw in manifests.items() if raw is not None}
        newest = max(committed, default=-1)
        for s in sorted(s for s, raw in manifests.items() if raw is None and s > newest):
            log.info(
                "rank %d: %s: not committed (no %s): a save killed half-way, or still in "
                "flight; not restored",
                ck.rank,
                self.uri(s3layout.step_prefix(s)),
                layout.STEP_META,
            )
        return TierView(committed, S3Source(self, manifests, run=ck.run.run))

    def note_resume(self, step: int) -> None:
        try:
            self.store.put(RESUME_FILE, _json(resume_doc(step)))
        except S3Error as exc:
            log.warning("could not record the resumed step: %s", exc)

    def close(self) -> None:
        self.store.close()


class S3Source(restore.Source):
    """Shards of committed steps in the store, read in parallel ranges."""

    committed = True

    def __init__(self, tier: S3Tier, manifests: dict[int, bytes | None], run: str):
        self.tier, self.store, self.run = tier.name, tier.store, run
        self.root = tier.location  # where a restore came from (RestoreInfo.source)
        self._manifests = manifests
        self._sizes: dict[int, dict[str, int]] = {}

    def label(self, step: int, name: str) -> str:
        return self.store.location.uri(s3layout.step_prefix(step) + name)

    def meta(self, step: int, rank: int) -> dict[str, Any]:
        name = s3layout.step_prefix(step) + layout.meta_name(rank)
        return layout.parse_meta(self.store.get(name), self.label(step, layout.meta_name(rank)))

    def size(self, step: int, rank: int) -> int | None:
        if step not in self._sizes:
            pre = s3layout.step_prefix(step)
            self._sizes[step] = {o.name[len(pre) :]: o.size for o in self.store.list_objects(pre)}
        size = self._sizes[step].get(layout.data_name(rank))
        if size is None:
            raise CorruptShardError(f"{self.label(step, layout.data_name(rank))}: no such object")
        return size

    def commit_save(self, step: int) -> str | None:
        raw = self._manifests.get(step)
        if raw is None:
            raise CorruptShardError(f"{self.label(step, layout.STEP_META)}: no such object")
        doc = layout.parse_meta(raw, self.label(step, layout.STEP_META))
        save = doc.get("save")
        return save if isinstance(save, str) else None

    def data(self, step: int, rank: int, size: int) -> np.ndarray:
        label = self.label(step, layout.data_name(rank))
        fits_in_memory(size, label)
        buf = np.empty(size, dtype=np.uint8)
        self.store.read_into(
            s3layout.step_prefix(step) + layout.data_name(rank), buf.data, size=size
        )
        return buf

    def data_range(self, step: int, rank: int, offset: int, size: int) -> np.ndarray:
        buf = np.empty(size, dtype=np.uint8)
        name = s3layout.step_prefix(step) + layout.data_name(rank)
        self.store.read_into(name, buf.data, offset=offset)
        return buf


def _later(other: object, save: str) -> bool:
    """``other`` is a later save of the same launch as ``save`` (``<launch>.<n>``)."""
    if not isinstance(other, str):
        return False
    launch, _, n = save.rpartition(".")
    o_launch, _, o_n = other.rpartition(".")
    return o_launch == launch and o_n.isascii() and o_n.isdigit() and int(o_n) > int(n)


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()
