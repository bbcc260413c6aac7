"""Measurement helpers of bench/checkpoint.py: the benchmark state, timing, and the ceilings
(memcpy, write+fsync, O_DIRECT, tmpfs) our saves are judged against, and a read throttle
that emulates slow persistent storage."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hyperpod_agent.checkpoint import fastio, layout

MiB = 1 << 20


def make_state(size: int, torch: Any) -> dict[str, Any]:
    """A model-like state: 15 float32 tensors plus one bfloat16 tensor, ``size`` bytes total."""
    n = size // 16 // 4
    if torch is None:
        return {
            f"layer{i}": np.random.default_rng(i).random(n, dtype=np.float32) for i in range(16)
        }
    state: dict[str, Any] = {f"layer{i}": torch.rand(n) for i in range(15)}
    state["emb_bf16"] = torch.rand(2 * n).to(torch.bfloat16)
    return state


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def best(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    """Fastest of ``reps`` runs (the machine is shared: the minimum is the least disturbed)."""
    runs = []
    for _ in range(reps):
        dt, out = timed(fn)
        runs.append(dt)
        del out
    dt, out = timed(fn)
    return min([*runs, dt]), out


def settle() -> None:
    """Let writeback and the discards of deleted files finish (the root filesystem here is
    mounted with ``discard``), so one measurement does not pay for the previous one. No
    sleep: on a VM with free page reporting, memory idle for a few seconds goes back to the
    host, and the next write pays a host page fault per page-cache page."""
    os.sync()


START_WRITEBACK = fastio.start_writeback  # kept: --writer plain turns the library's off


def write_fsync(path: Path, data: np.ndarray, writeback: bool = False) -> None:
    """The ceiling: a plain write+fsync (16 MiB writes, fsync, rename, directory fsync),
    as any writer does it: the copy into the page cache, then the disk, one after the other.
    With ``writeback``, the writeback of each chunk is started as soon as it is written."""
    tmp = path.with_name(f".{path.name}.tmp")
    view = data.data.cast("B")
    with open(tmp, "wb", buffering=0) as f:
        for start in range(0, len(view), 16 * MiB):
            f.write(view[start : start + 16 * MiB])
            if writeback:
                START_WRITEBACK(f.fileno(), start, min(16 * MiB, len(view) - start))
        os.fsync(f.fileno())
    os.replace(tmp, path)
    layout.fsync_dir(path.parent)


def aligned(size: int) -> np.ndarray:
    """A page-aligned buffer (anonymous mapping), filled: an O_DIRECT source."""
    import mmap

    out = np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)
    out[:] = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    return out


def ceilings(size: int, disk: Path) -> dict[str, float]:
    src = aligned(size)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in: staging buffers are reused, so warm is the ceiling
    dt = min(timed(lambda: np.copyto(dst, src))[0] for _ in range(3))
    path = disk / "fsync-probe"
    # The three ways to write a buffer durably, interleaved, best of 3 each.
    ways = {
        "write+fsync GB/s": lambda: write_fsync(path, src),
        "write+fsync, writeback started per chunk GB/s": lambda: write_fsync(path, src, True),
        "O_DIRECT write GB/s": lambda: layout.direct_write(path, src),
    }
    best_of: dict[str, float] = {}
    for _ in range(3):
        for name, fn in ways.items():
            settle()
            dt_way = timed(fn)[0]
            path.unlink()
            best_of[name] = min(best_of.get(name, dt_way), dt_way)
    shm = Path("/dev/shm") / f"hp-ckpt-bench-{os.getpid()}"
    dt_s = min(timed(lambda: write_fsync(shm, src))[0] for _ in range(3))
    shm.unlink()
    return {
        "memcpy GB/s": size / dt / 1e9,
        **{name: size / v / 1e9 for name, v in best_of.items()},
        "tmpfs write GB/s": size / dt_s / 1e9,
    }


def throttle_reads(rate: float) -> Callable[[], None]:
    """Make the persistent tier's reads no faster than ``rate`` bytes/s; return an undo."""
    from hyperpod_agent.checkpoint import restore

    real_file, real_range = layout.read_file, layout.read_range

    def slow(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        def wrapped(*args: Any) -> np.ndarray:
            t0 = time.perf_counter()
            out = fn(*args)
            time.sleep(max(0.0, out.nbytes / rate - (time.perf_counter() - t0)))
            return out

        return wrapped

    class Slow(restore.DirSource):
        def data(self, step: int, rank: int, size: int) -> np.ndarray:
            return slow(real_file)(layout.step_dir(self.root, step) / layout.data_name(rank), size)

    real_cls = restore.DirSource
    restore.DirSource = Slow  # type: ignore[misc]
    import hyperpod_agent.checkpoint.checkpointer as ck

    ck.restore.DirSource = Slow  # type: ignore[misc]

    def undo() -> None:
        restore.DirSource = real_cls  # type: ignore[misc]
        layout.read_file, layout.read_range = real_file, real_range

    return undo
