"""The Checkpointer: stage a state in memory, write it to the tiers in the background, and
restore the newest complete step from the fastest tier that has it."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from hyperpod_agent.checkpoint import layout, loader, metrics, restore
from hyperpod_agent.checkpoint.balance import assign_owners
from hyperpod_agent.checkpoint.errors import (
    CheckpointConfigError,
    CheckpointError,
)
from hyperpod_agent.checkpoint.replica import ReplicaClient, ReplicaServer
from hyperpod_agent.checkpoint.state import ALIGN, Leaf, flatten
from hyperpod_agent.checkpoint.state import layout as plan_layout

log = logging.getLogger(__name__)

Peers = Mapping[str, tuple[str, int]]


class SaveHandle:
    """A save in flight: staged in memory, durable writes still running."""

    def __init__(self, step: int, future: Future[dict[str, str]], times: dict[str, float]):
        self.step = step
        self._future = future
        self._times = times

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds from the save call until each finished tier was durable."""
        return {k: v for k, v in self._times.items() if k != "start"}

    def done(self) -> bool:
        """True once every tier of this save has finished (well or not)."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> dict[str, str]:
        """Block until durable; return tier -> "ok". Raise CheckpointError if a tier failed."""
        tiers = self._future.result(timeout)
        failed = {t: s for t, s in tiers.items() if s != "ok"}
        if failed:
            raise CheckpointError(
                f"step {self.step}: "
                + "; ".join(f"{t} tier failed: {s}" for t, s in failed.items())
            )
        return tiers


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
        job_id: str = "local",
    ):
        if not 0 <= rank < world_size:
            raise CheckpointConfigError(f"rank {rank} is outside world size {world_size}")
        for name, value in (
            ("persistent_every", persistent_every),
            ("keep_memory", keep_memory),
            ("keep_persistent", keep_persistent),
        ):
            if value < 1:
                raise CheckpointConfigError(f"{name} must be at least 1, got {value}")
        self.rank, self.world_size, self.local_rank, self.node = rank, world_size, local_rank, node
        self.persistent_dir = layout.ensure_dir(Path(persistent_dir), "persistent tier")
        mem = memory_dir if memory_dir is not None else f"/dev/shm/hyperpod-ckpt/{job_id}"
        self.memory_dir = layout.ensure_dir(Path(mem), "memory tier")
        self.persistent_every, self.keep_memory = persistent_every, keep_memory
        self.keep_persistent = keep_persistent
        self.replicated = frozenset(replicated)
        group = list(replica_group) if replica_group is not None else list(range(world_size))
        self.replica_group = group if rank in group else [rank]
        self.commit_timeout, self.peer_timeout = commit_timeout, peer_timeout
        self.peers: dict[str, tuple[str, int]] = dict(peers or {})
        if self.peers and node not in self.peers:
            raise CheckpointConfigError(
                f"node {node!r} is not in the peer list ({', '.join(sorted(self.peers))})"
            )
        self.server: ReplicaServer | None = None
        if serve and node in self.peers:
            host, port = self.peers[node]
            self.server = ReplicaServer(self.memory_dir, host, port).start()
        self._replica = self._successor_client()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hyperpod-ckpt")
        self._staging = np.empty(0, dtype=np.uint8)
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
        return ReplicaClient(host, port, nxt, timeout=self.peer_timeout)

    # ---- save -----------------------------------------------------------------------------

    def save(self, step: int, state: Any) -> SaveHandle:
        """Stage ``state`` in memory and return; tiers are written in the background.

        Unsupported values raise UnsupportedStateError naming the path before anything is
        written. Blocks first if the previous save still uses the staging buffer.
        """
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**10:
            raise CheckpointError(f"step must be an int in [0, 1e10), got {step!r}")
        t0 = time.perf_counter()
        skeleton, leaves = flatten(state)
        with self._lock:
            if self._last is not None:
                self._last._future.exception()  # back-pressure: the staging buffer is reused
            size = plan_layout(leaves)
            if self._staging.size < size:
                self._staging = np.empty(size, dtype=np.uint8)
            from hyperpod_agent.checkpoint.state import copy_leaf

            for leaf in leaves:
                copy_leaf(leaf, self._staging)
                leaf.value = None  # the staged copy is all we keep
            index = self._saves
            self._saves += 1
            times = {"start": t0}
            fut = self._pool.submit(self._durable, step, index, skeleton, leaves, size, times)
            self._last = SaveHandle(step, fut, times)
        metrics.SAVE_BLOCKED.observe(time.perf_counter() - t0)
        return self._last

    def wait(self) -> None:
        """Wait for every save so far; raise if the last one failed on a tier."""
        with self._lock:
            last = self._last
        if last is not None:
            last.wait()

    def close(self) -> None:
        """Finish pending saves and stop the replica server if this object hosts one."""
        self._pool.shutdown(wait=True)
        if self._replica is not None:
            self._replica.close()
        if self.server is not None:
            self.server.stop()

    def _meta(
        self, step: int, skeleton: Any, entries: list[dict[str, Any]], size: int
    ) -> dict[str, Any]:
        return {
            "format": layout.FORMAT,
            "step": step,
            "rank": self.rank,
            "world_size": self.world_size,
            "node": self.node,
            "created": time.time(),
            "checksum": layout.CHECKSUM,
            "skeleton": skeleton,
            "entries": entries,
            "data_size": size,
        }

    def _durable(
        self,
        step: int,
        index: int,
        skeleton: Any,
        leaves: list[Leaf],
        size: int,
        times: dict[str, float],
    ) -> dict[str, str]:
        buf = self._staging
        entries = []
        for leaf in leaves:
            crc = layout.checksum(buf[leaf.offset : leaf.offset + leaf.nbytes])
            entries.append({**leaf.describe(), "offset": leaf.offset, "crc32": crc})
        full = self._meta(step, skeleton, entries, size)
        tiers: dict[str, str] = {}
        jobs: list[tuple[str, Any]] = []
        if self._replica is not None:
            jobs.append(("peer", lambda: self._write_peer(step, buf[:size], full)))
        if index % self.persistent_every == 0:
            jobs.append(
                ("persistent", lambda: self._write_persistent(step, skeleton, entries, buf))
            )
        # Slower tiers run beside the memory tier: network, disk and memory are different
        # bottlenecks, and sendall, write, fsync and crc32 all release the GIL.
        threads = [
            threading.Thread(
                target=self._tier,
                args=(tiers, name, fn, times),
                name=f"hyperpod-ckpt-{name}",
                daemon=True,
            )
            for name, fn in jobs
        ]
        for t in threads:
            t.start()
        self._tier(tiers, "memory", lambda: self._write_memory(step, buf[:size], full), times)
        for t in threads:
            t.join()
        return tiers

    def _tier(self, tiers: dict[str, str], name: str, fn: Any, times: dict[str, float]) -> None:
        try:
            fn()
            tiers[name] = "ok"
        except Exception as exc:
            # One tier failing must not stop the others: a full /dev/shm still leaves the
            # persistent copy, and a dead peer still leaves the local one. The failure is
            # reported through the save handle.
            unexpected = not isinstance(exc, OSError | CheckpointError)
            log.warning(
                "rank %d: %s tier write failed: %s", self.rank, name, exc, exc_info=unexpected
            )
            metrics.TIER_FAILURES.labels(name).inc()
            tiers[name] = str(exc) or type(exc).__name__
        times[name] = time.perf_counter() - times["start"]

    def _write_memory(self, step: int, data: np.ndarray, meta: dict[str, Any]) -> None:
        d = layout.step_dir(self.memory_dir, step)
        layout.atomic_write(d / layout.data_name(self.rank), [data.data])
        layout.write_json(d / layout.meta_name(self.rank), meta)
        metrics.BYTES_WRITTEN.labels("memory").inc(data.nbytes)
        layout.prune(self.memory_dir, self.keep_memory, [self.rank])

    def _write_peer(self, step: int, data: np.ndarray, meta: dict[str, Any]) -> None:
        import json

        assert self._replica is not None
        self._replica.put(step, layout.data_name(self.rank), data)
        self._replica.put(
            step, layout.meta_name(self.rank), json.dumps(meta, separators=(",", ":")).encode()
        )
        metrics.BYTES_WRITTEN.labels("peer").inc(data.nbytes)
        self._replica.prune([self.rank], self.keep_memory)

    def _write_persistent(
        self, step: int, skeleton: Any, entries: list[dict[str, Any]], buf: np.ndarray
    ) -> None:
        owners = assign_owners(
            [
                Leaf(e["path"], e["kind"], e["dtype"], tuple(e["shape"]), e["nbytes"])
                for e in entries
            ],
            self.replicated,
            self.replica_group,
        )
        chunks: list[memoryview] = []
        stored: list[dict[str, Any]] = []
        pos = 0
        for e in entries:
            owner = owners.get(e["path"], self.rank)
            if owner != self.rank:
                stored.append(
                    {k: e[k] for k in ("path", "kind", "dtype", "shape", "nbytes")}
                    | {"owner": owner}
                )
                continue
            pad = -pos % ALIGN
            if pad:
                chunks.append(memoryview(bytes(pad)))
                pos += pad
            chunks.append(buf[e["offset"] : e["offset"] + e["nbytes"]].data)
            stored.append({**e, "offset": pos})
            pos += e["nbytes"]
        d = layout.step_dir(self.persistent_dir, step)
        layout.atomic_write(d / layout.data_name(self.rank), chunks)
        layout.write_json(d / layout.meta_name(self.rank), self._meta(step, skeleton, stored, pos))
        metrics.BYTES_WRITTEN.labels("persistent").inc(pos)
        if self.rank == 0:
            self._commit(step)

    def _commit(self, step: int) -> None:
        """Rank 0 writes the step metadata once every rank's shard is in the persistent tier."""
        deadline = time.monotonic() + self.commit_timeout
        while True:
            info = layout.scan(self.persistent_dir).get(step)
            if info is not None and info.complete(self.world_size):
                break
            if time.monotonic() >= deadline:
                have = sorted(info.ranks) if info else []
                raise CheckpointError(
                    f"step {step}: only ranks {have} of {self.world_size} reached the "
                    f"persistent tier within {self.commit_timeout:g} s"
                )
            time.sleep(0.05)
        d = layout.step_dir(self.persistent_dir, step)
        layout.write_json(
            d / layout.STEP_META,
            {
                "format": layout.FORMAT,
                "step": step,
                "world_size": self.world_size,
                "checksum": layout.CHECKSUM,
                "created": time.time(),
            },
        )
        layout.prune(self.persistent_dir, self.keep_persistent, committed=True)

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
        restored = loader.load_latest(self, template, agree)
        if restored is not None and self.rank == 0:
            self._note_resume(restored[0])
        return restored

    def _note_resume(self, step: int) -> None:
        """Tell the controller which step a requeued job resumed from: rank 0 writes
        ``<persistent>/resume.json`` (contract in docs/auto-resume.md). Best effort: a
        failure here must never stop training."""
        restarts = os.environ.get("SLURM_RESTART_COUNT", "")
        doc: dict[str, Any] = {
            "step": int(step),
            "at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        }
        if restarts.isdigit():
            doc["restart_count"] = int(restarts)
        if os.environ.get("SLURM_JOB_ID", "").isdigit():
            doc["job_id"] = int(os.environ["SLURM_JOB_ID"])
        path = self.persistent_dir / "resume.json"
        tmp = path.with_name(f".resume.json.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(doc) + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not record the resumed step in %s: %s", path, exc)

    def load(self, step: int, template: Any = None) -> Any:
        """Restore one given step; raise CheckpointError if no tier holds it intact."""
        return loader.load_step(self, step, template)
