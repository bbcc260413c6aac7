"""The Checkpointer: stage a state in memory, write it to the tiers in the background, and
restore the newest complete step from the fastest tier that has it.

This module holds its construction, the staging half of a save and the lifecycle; the
background writes to the tiers are in durable.py, the restore in loader.py."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hyperpod_agent import progress
from hyperpod_agent.checkpoint import (
    durable,
    handshake,
    identity,
    layout,
    loader,
    memtier,
    metrics,
    restore,
)
from hyperpod_agent.checkpoint.errors import CheckpointConfigError, CheckpointError
from hyperpod_agent.checkpoint.handle import SaveHandle, spare_cpus
from hyperpod_agent.checkpoint.persistent import DirTier, PersistentTier
from hyperpod_agent.checkpoint.replica import ReplicaServer
from hyperpod_agent.checkpoint.replica_client import ReplicaClient
from hyperpod_agent.checkpoint.s3config import S3Options
from hyperpod_agent.checkpoint.staging import Progress, StagingPool
from hyperpod_agent.checkpoint.state import copy_leaf, flatten
from hyperpod_agent.checkpoint.state import layout as plan_layout
from hyperpod_agent.checkpoint.tiers import open_tiers
from hyperpod_agent.checkpoint.uploads import Uploads

log = logging.getLogger(__name__)

Peers = Mapping[str, tuple[str, int]]


class Checkpointer:
    """Tiered checkpoints for one rank. See docs/checkpoint.md."""

    def __init__(
        self,
        persistent_dir: str | os.PathLike[str],
        *,
        memory_dir: str | os.PathLike[str] | None = None,
        rank: int = 0,
        world_size: int = 1,
        local_rank: int = 0,
        node: str = "localhost",
        peers: Peers | None = None,
        serve: bool = False,
        persistent_every: int = 1,
        keep_memory: int = 2,
        keep_persistent: int = 3,
        replicated: Collection[str] = (),
        replica_group: Sequence[int] | None = None,
        commit_timeout: float = 300.0,
        peer_timeout: float = 30.0,
        peer_streams: int = 4,
        overlap: bool | None = None,
        secret: bytes | str | None = None,
        job_id: str | None = None,
        attempt: str | None = None,
        s3: str | None = None,
        s3_every: int = 1,
        s3_options: S3Options | None = None,
        job_key: str | None = None,
        direct_io: bool = True,
    ):
        if not 0 <= rank < world_size:
            raise CheckpointConfigError(f"rank {rank} is outside world size {world_size}")
        for name, value in (
            ("persistent_every", persistent_every),
            ("keep_memory", keep_memory),
            ("keep_persistent", keep_persistent),
            ("peer_streams", peer_streams),
            ("s3_every", s3_every),
        ):
            if value < 1:
                raise CheckpointConfigError(f"{name} must be at least 1, got {value}")
        self.rank, self.world_size, self.local_rank, self.node = rank, world_size, local_rank, node
        self.peers: dict[str, tuple[str, int]] = dict(peers or {})
        if self.peers and node not in self.peers:
            raise CheckpointConfigError(
                f"node {node!r} is not in the peer list ({', '.join(sorted(self.peers))})"
            )
        if job_key is not None and not identity.JOB_KEY_RE.fullmatch(job_key):
            raise CheckpointConfigError(
                f"job key {job_key!r}: expected 8-128 of A-Z, a-z, 0-9, '.', '_', ':', '-'"
            )
        self.commit_timeout, self.peer_timeout = commit_timeout, peer_timeout
        # The durable tiers, in the order a restore tries them; the run owns its fast tiers:
        # they live in a directory named after it (identity.py).
        self.tiers, self.run = open_tiers(
            persistent_dir,
            persistent_every,
            s3,
            s3_every,
            s3_options,
            job_key,
            rank,
            commit_timeout,
            direct_io,
        )
        self.persistent: PersistentTier = self.tiers[0]
        self.persistent_dir: Path | None = (
            self.persistent.root if isinstance(self.persistent, DirTier) else None
        )
        # The job's secret if one is set (a standalone replica server knows only that one),
        # else the run's own: every rank reads it from the persistent directory.
        self.secret: bytes = handshake.as_secret(secret) or self.run.secret
        self.attempt = attempt or identity.launch_token(os.environ, world_size)
        self.memory_root = (
            Path(memory_dir) if memory_dir is not None else identity.default_job_dir(job_id)
        )
        self._run_dir = memtier.RunDir(self.memory_root, self.run, self.persistent.location, rank)
        self.memory_dir: Path | None = self._run_dir.path
        others = self._run_dir.others() if self.memory_dir is not None else []
        if others and local_rank == 0:
            log.warning(
                "memory tier %s: ignoring the checkpoints of %d other run(s) here (%s): they "
                "are not this run's (its identity is in %s); the node agent frees them",
                self.memory_root,
                len(others),
                ", ".join(others),
                self.persistent.location,
            )
        self.persistent_every, self.keep_memory = persistent_every, keep_memory
        self.keep_persistent = keep_persistent
        self.replicated = frozenset(replicated)
        group = list(replica_group) if replica_group is not None else list(range(world_size))
        self.replica_group = group if rank in group else [rank]
        self.peer_streams = peer_streams
        # Writing the persistent tier while later leaves are still being staged shortens the
        # time to durable by the staging copy, but the writer then competes with the training
        # thread for CPU and memory bandwidth: on 2 cores it made the blocked time 1.5-3x
        # longer (bench/checkpoint.py). So by default only with CPUs to spare.
        self.overlap = spare_cpus() if overlap is None else overlap
        self.server: ReplicaServer | None = None
        if serve and node in self.peers:
            host, port = self.peers[node]
            if self.memory_dir is None:
                log.error("rank %d: no replica server: this node has no memory tier", rank)
            else:
                try:
                    self.server = ReplicaServer(
                        self.memory_root, host, port, secret=self.secret
                    ).start()
                except BaseException:
                    self._run_dir.release()
                    for tier in self.tiers:
                        tier.close()
                    raise
        self._replica = self._successor_client()
        self._workers = ThreadPoolExecutor(1, thread_name_prefix="hyperpod-ckpt")
        self._pool = StagingPool(self.memory_dir, rank)
        self._uploads = Uploads(self.tiers, self._pool, rank)  # run on after their save
        self._last: SaveHandle | None = None
        self._saves = 0
        self._lock = threading.Lock()
        self.last_restore: restore.RestoreInfo | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Checkpointer:
        """Build from HYPERPOD_CHECKPOINT_* and torchrun/Slurm variables (see env.py)."""
        from hyperpod_agent.checkpoint.env import settings_from_env

        kwargs = settings_from_env(os.environ if environ is None else environ)
        kwargs.update(overrides)
        return cls(**kwargs)

    def successor(self) -> str | None:
        """The node holding this node's replicas: the next one in the sorted node list."""
        nodes = sorted(self.peers)
        if len(nodes) < 2:
            return None
        return nodes[(nodes.index(self.node) + 1) % len(nodes)]

    def _successor_client(self) -> ReplicaClient | None:
        nxt = self.successor()
        if nxt is None:
            return None
        host, port = self.peers[nxt]
        return ReplicaClient(
            host,
            port,
            self.run.namespace,
            node=nxt,
            timeout=self.peer_timeout,
            secret=self.secret,
        )

    # ---- save -----------------------------------------------------------------------------

    def save(self, step: int, state: Any) -> SaveHandle:
        """Stage ``state`` in memory and return; tiers are written in the background.

        Unsupported values raise UnsupportedStateError naming the path before anything is
        written. Blocks first if the previous save still uses the staging buffer.

        Records ``step`` as this rank's progress, and the time it blocks as a paused phase
        (hyperpod_agent.progress): a job whose only steps are its saves is watched for hangs.
        """
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**10:
            raise CheckpointError(f"step must be an int in [0, 1e10), got {step!r}")
        progress.step(step)
        with progress.paused("checkpoint save"):
            return self._stage(step, state)

    def _stage(self, step: int, state: Any) -> SaveHandle:
        t0 = time.perf_counter()
        skeleton, leaves = flatten(state)
        with self._lock:
            if self._last is not None:
                # Back-pressure: one save in flight at a time, so the staging memory is bounded.
                self._last._future.exception()
            self._run_dir.ensure()
            size = plan_layout(leaves)
            slot = self._pool.acquire(size)
            staging = slot.array[:size]
            index = self._saves
            self._saves += 1
            save = f"{self.attempt}.{index}"
            times = {"start": t0}
            progress = Progress()
            uploads = self._uploads.plan(step, index, slot)
            # The writers start now and follow the copy below leaf by leaf.
            fut = self._workers.submit(
                durable.write,
                self,
                step,
                index,
                save,
                skeleton,
                leaves,
                size,
                times,
                slot,
                progress,
                uploads,
            )
            self._last = SaveHandle(
                step, fut, times, [f for f in uploads.values() if isinstance(f, Future)]
            )
            try:
                for leaf in leaves:
                    copy_leaf(leaf, staging)
                    leaf.value = None  # the staged copy is all we keep
                    progress.advance(leaf.offset + leaf.nbytes)
            except BaseException as exc:
                progress.fail(exc)  # nothing of this save is published anywhere
                fut.exception()
                raise
            progress.finish(size)
        metrics.SAVE_BLOCKED.observe(time.perf_counter() - t0)
        return self._last

    def wait(self) -> None:
        """Wait for every save so far (and its uploads); raise if the last one failed on a
        tier."""
        with self._lock:
            last = self._last
            running = self._uploads.running()
        with progress.paused("checkpoint save"):
            if last is not None:
                last.wait()
            for f in running:
                f.result()

    def close(self) -> None:
        """Finish pending saves and stop the replica server if this object hosts one."""
        with progress.paused("checkpoint save"):
            self._workers.shutdown(wait=True)
            self._uploads.close()
        self._pool.close()
        if self._replica is not None:
            self._replica.close()
        if self.server is not None:
            self.server.stop()
        for tier in self.tiers:
            tier.close()
        self._run_dir.release()

    def rank_meta(
        self, step: int, save: str, skeleton: Any, entries: list[dict[str, Any]], size: int
    ) -> dict[str, Any]:
        """This rank's metadata of one save in one tier."""
        return {
            "format": layout.FORMAT,
            "step": step,
            "rank": self.rank,
            "world_size": self.world_size,
            "run": self.run.run,
            "save": save,
            "node": self.node,
            "created": time.time(),
            "checksum": layout.CHECKSUM,
            "skeleton": skeleton,
            "entries": entries,
            "data_size": size,
        }

    # ---- restore --------------------------------------------------------------------------

    def load_latest(
        self, template: Any = None, agree: bool | None = None
    ) -> tuple[int, Any] | None:
        """Restore the newest step that is complete for every rank, or None if there is none.

        Tries the memory tier, then peers' replicas, then the persistent tier; a missing or
        corrupt shard is logged (naming the shard) and the next source, then the previous step,
        is tried. A template that does not fit raises TemplateMismatchError. With ``agree``
        (default: when torch.distributed is initialized) all ranks settle on the oldest step any
        of them could restore, so a rank that had to fall back does not leave the others ahead.
        """
        with progress.paused("checkpoint load"):
            restored = loader.load_latest(self, template, agree)
        if restored is not None and self.rank == 0:
            self.persistent.note_resume(restored[0])
        return restored

    def load(self, step: int, template: Any = None) -> Any:
        """Restore one given step; raise CheckpointError if no tier holds it intact."""
        with progress.paused("checkpoint load"):
            return loader.load_step(self, step, template)
