"""Checkpoint benchmark: hyperpod_agent.checkpoint vs torch.save vs DCP save / async_save.

Measures, for each state size, the time a save blocks training, the durable write rate, the
load rate, and the restore time per tier, next to ceilings measured on the same machine:
memcpy into a warm buffer, a plain write+fsync to the persistent directory, the same with
O_DIRECT, and one upload of the same size to the S3 server.

Our persistent tier is measured twice, side by side: in a directory on the root disk (as
torch.save and DCP write) and in an S3 store (``rclone serve s3`` on loopback, its objects
on tmpfs, so that the S3 path and not a second disk is measured). The memory tiers and the
peer's replica server use tmpfs (/dev/shm).

The disk of a shared VM drifts from one write to the next, so each of our saves is paired
with a plain write+fsync of the same size just before it (for the S3 tier: one upload of
the same size), and the figures against the targets are printed per pair, best against best
and median against median.

Slow persistent storage is emulated by rate-limiting our reader (a token bucket around the
file reads) rather than by dm-delay: dm-delay needs a block device and root-wide setup on a
shared machine, and it delays requests, not bandwidth.

    .venv/bin/python bench/checkpoint.py --reps 8   # 256 MiB and 1 GiB (docs/benchmarks.md)
    .venv/bin/python bench/checkpoint.py --quick    # 64 MiB, for a smoke run
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hyperpod_agent.checkpoint import Checkpointer, ReplicaServer, fastio, layout  # noqa: E402
from hyperpod_agent.checkpoint.s3store import S3Store  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402

MiB = 1 << 20
# No MD5 ETag and no re-reading of each upload (bench/s3_clients.py): rclone's fastest.
S3_SERVER_ARGS = ("--etag-hash", "", "--ignore-checksum")
FS_ROW = "hyperpod (memory+peer+persistent)"
DIRECT_IO = True  # --writer
S3_ROW = "hyperpod (memory+peer+S3)"


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


def bench_ours(
    size: int,
    torch: Any,
    persistent: Path | str,
    shm: Path,
    reps: int,
    slow_rate: float,
    paired: Callable[[np.ndarray], None],
) -> dict[str, Any]:
    """Our saves and restores with the persistent tier at ``persistent`` (a directory or an
    S3 URL); ``paired(buffer)`` is the ceiling measured just before each save."""
    state = make_state(size, torch)
    mem_a, mem_b = shm / "shm-a", shm / "shm-b"
    s3 = isinstance(persistent, str)
    ckpt = Checkpointer(
        persistent,
        memory_dir=mem_a,
        node="a",
        peers={"a": ("127.0.0.1", 1), "b": ("127.0.0.1", 1)},
        keep_memory=1,
        keep_persistent=1,
    )
    # The peer's replica server holds the run's secret, as the run's own ranks would.
    server = ReplicaServer(mem_b, "127.0.0.1", 0, secret=ckpt.secret).start()
    ckpt.close()
    peers = {"a": ("127.0.0.1", 1), "b": server.address}
    ckpt = Checkpointer(
        persistent,
        memory_dir=mem_a,
        node="a",
        peers=peers,
        keep_memory=1,
        keep_persistent=1,
        direct_io=DIRECT_IO,
    )
    row: dict[str, Any] = {}
    probe = aligned(size)
    try:
        ckpt.save(0, state).wait()  # first save allocates and faults in the staging files
        blocked, all_tiers, durable, ceiling, writer = [], [], [], [], []
        tiers: dict[str, list[float]] = {}
        for i in range(1, reps + 1):
            # The disk's write+fsync rate drifts from minute to minute on a shared machine,
            # so each save is paired with a ceiling write just before it and judged by the
            # ratio of the two.
            settle()
            dt_c = timed(lambda: paired(probe))[0]
            settle()
            t0 = time.perf_counter()
            h = ckpt.save(i, state)
            blocked.append(time.perf_counter() - t0)
            h.wait()
            all_tiers.append(time.perf_counter() - t0)
            for tier, sec in h.seconds.items():
                tiers.setdefault(tier, []).append(sec)
            ceiling.append(size / dt_c / 1e9)
            durable.append(size / h.seconds["persistent"] / 1e9)
            # What the background writer achieves once the state is staged: the staging copy
            # is the blocked time, reported on its own.
            writer.append(size / (h.seconds["persistent"] - blocked[-1]) / 1e9)
        row["blocked ms"] = min(blocked) * 1e3
        row["blocked median ms"] = statistics.median(blocked) * 1e3
        row["durable GB/s"] = max(durable)
        row["all tiers GB/s"] = size / min(all_tiers) / 1e9
        row["paired ceiling GB/s"] = ceiling
        row["paired durable GB/s"] = durable
        row["writer GB/s"] = writer
        row["tier GB/s"] = {t: size / min(v) / 1e9 for t, v in tiers.items()}
        restore_s: dict[str, float] = {}
        dt, got = best(ckpt.load_latest, reps)
        assert got is not None and ckpt.last_restore and ckpt.last_restore.tier == "memory"
        restore_s["memory"] = dt
        row["load GB/s"] = size / dt / 1e9
        del got
        shutil.rmtree(mem_a)
        mem_a.mkdir()
        peer = f"peer (loopback TCP, {ckpt.peer_streams} streams)"
        dt, got = best(ckpt.load_latest, reps)
        assert got is not None and ckpt.last_restore and ckpt.last_restore.tier == "peer"
        restore_s[peer] = dt
        del got
        for d in (mem_a, mem_b):
            shutil.rmtree(d)
            d.mkdir()
        dt, got = best(ckpt.load_latest, reps)
        assert got is not None and ckpt.last_restore.tier == "persistent"
        if s3:
            restore_s["S3 (rclone on loopback, 8 ranged GETs in flight)"] = dt
        else:
            restore_s["persistent (local disk, page cache after the first read)"] = dt
            del got
            undo = throttle_reads(slow_rate)
            try:
                dt, got = best(ckpt.load_latest, reps)
            finally:
                undo()
            assert got is not None and ckpt.last_restore.tier == "persistent"
            restore_s[f"persistent (emulated {slow_rate / 1e9:g} GB/s)"] = dt
            row["peer speedup"] = dt / restore_s[peer]
        del got
        row["restore s"] = restore_s
    finally:
        ckpt.close()
        server.stop()
    return row


def bench_torch_save(size: int, torch: Any, work: Path, reps: int) -> dict[str, Any]:
    state = make_state(size, torch)
    path = work / "model.pt"

    def save() -> None:
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    def settled_save() -> float:
        settle()
        return timed(save)[0]

    fastest = min(settled_save() for _ in range(reps))
    dt, _ = best(lambda: torch.load(path, weights_only=True), reps)
    return {
        "blocked ms": fastest * 1e3,
        "durable GB/s": size / fastest / 1e9,
        "load GB/s": size / dt / 1e9,
    }


def bench_dcp(size: int, torch: Any, work: Path, reps: int, use_async: bool) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    state = make_state(size, torch)
    blocked, durable = [], []
    stager = None
    if use_async:
        # Staging buffers are cached by the stager and reused across saves; pinned memory
        # needs CUDA, so it is off on a CPU-only machine.
        stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=False,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=False,
            )
        )
    for i in range(reps + 1):
        cid = work / f"dcp-{i}"
        settle()
        t0 = time.perf_counter()
        if use_async:
            resp = dcp.async_save(state, checkpoint_id=cid, no_dist=True, async_stager=stager)
            staged = getattr(resp, "staging_completion", None)
            if staged is not None:
                staged.result()
            t1 = time.perf_counter()
            getattr(resp, "upload_completion", resp).result()
        else:
            dcp.save(state, checkpoint_id=cid, no_dist=True)
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        if i:  # the first round warms up the stager's buffers
            blocked.append(t1 - t0)
            durable.append(t2 - t0)
        if i < reps:
            shutil.rmtree(cid)
    if stager is not None:
        stager.close()
    target = make_state(size, torch)
    dt, _ = best(lambda: dcp.load(target, checkpoint_id=work / f"dcp-{reps}", no_dist=True), reps)
    return {
        "blocked ms": min(blocked) * 1e3,
        "durable GB/s": size / min(durable) / 1e9,
        "load GB/s": size / dt / 1e9,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one 64 MiB state")
    ap.add_argument("--sizes", default="256,1024", help="state sizes in MiB")
    ap.add_argument("--reps", type=int, default=2, help="timed saves per method (best kept)")
    ap.add_argument("--dir", default="/var/tmp/hp-ckpt/bench", help="persistent directory")
    ap.add_argument(
        "--slow-gbps", type=float, default=1.0, help="emulated persistent read bandwidth in GB/s"
    )
    ap.add_argument(
        "--writer",
        choices=("direct", "writeback", "plain"),
        default="direct",
        help="how our persistent tier writes: O_DIRECT (the default), buffered with the "
        "writeback of each chunk started at once, or a plain write+fsync (as before)",
    )
    args = ap.parse_args()
    if args.writer != "direct":
        global DIRECT_IO
        DIRECT_IO = False
    if args.writer == "plain":
        fastio.start_writeback = lambda fd, offset, length: None
    # DCP warns that it runs without a process group: expected in a one-process benchmark.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed")
    sizes = [64] if args.quick else [int(s) for s in args.sizes.split(",")]
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        torch = None
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    print(
        f"torch {torch.__version__ if torch else 'absent'}, numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs, persistent dir {base}, CRC-32 by {layout.checksum_backend()}, "
        f"persistent writer: {args.writer}"
    )
    rows: list[tuple[str, int, dict[str, Any]]] = []
    with (
        tempfile.TemporaryDirectory(prefix="hp-ckpt-s3-", dir="/dev/shm") as s3dir,
        S3Server(Path(s3dir), extra_args=S3_SERVER_ARGS) as srv,
    ):
        os.environ.update(srv.env())  # the store's endpoint and keys, as AWS variables
        store = S3Store("s3://ckpt/probe")
        for mib in sizes:
            size = mib * MiB
            work = Path(tempfile.mkdtemp(dir=base))
            shm = Path(tempfile.mkdtemp(prefix="hp-ckpt-bench-", dir="/dev/shm"))
            try:
                for k, v in ceilings(size, work).items():
                    print(f"[{mib} MiB] ceiling {k}: {v:.2f}")
                probe = work / "fsync-probe"
                ours = bench_ours(
                    size,
                    torch,
                    work / "persistent",
                    shm / "fs",
                    args.reps,
                    args.slow_gbps * 1e9,
                    lambda buf, p=probe: (write_fsync(p, buf), p.unlink()),
                )
                rows.append((FS_ROW, mib, ours))
                gc.collect()
                ours = bench_ours(
                    size,
                    torch,
                    f"s3://ckpt/run-{mib}",
                    shm / "s3",
                    args.reps,
                    args.slow_gbps * 1e9,
                    lambda buf: store.put("upload-probe", buf.data),
                )
                rows.append((S3_ROW, mib, ours))
                gc.collect()
                if torch is not None:
                    rows.append(
                        ("torch.save + fsync", mib, bench_torch_save(size, torch, work, args.reps))
                    )
                    gc.collect()
                    rows.append(("dcp.save", mib, bench_dcp(size, torch, work, args.reps, False)))
                    gc.collect()
                    rows.append(
                        (
                            "dcp.async_save (DefaultStager)",
                            mib,
                            bench_dcp(size, torch, work, args.reps, True),
                        )
                    )
                    gc.collect()
            finally:
                shutil.rmtree(work, ignore_errors=True)
                shutil.rmtree(shm, ignore_errors=True)
        store.close()
    print()
    print(
        f"| {'method':36} | {'size':>8} | {'blocked ms':>10} | {'durable GB/s':>12} | "
        f"{'load GB/s':>9} |"
    )
    print(f"|{'-' * 38}|{'-' * 10}:|{'-' * 11}:|{'-' * 13}:|{'-' * 10}:|")
    for name, mib, r in rows:
        print(
            f"| {name:36} | {mib:>4} MiB | {r['blocked ms']:>10.1f} | "
            f"{r['durable GB/s']:>12.2f} | {r['load GB/s']:>9.2f} |"
        )
    print_tiers(rows, "restore (hyperpod), tier", "restore s", "seconds", ".3f")
    print()
    print("Against the targets (hyperpod):")
    for name, mib, r in rows:
        if "paired ceiling GB/s" not in r:
            continue
        ceil, ours, writer = r["paired ceiling GB/s"], r["paired durable GB/s"], r["writer GB/s"]
        pairs = ", ".join(f"{d / c:.0%} of {c:.2f}" for d, c in zip(ours, ceil, strict=True))
        top, median = max(ceil), statistics.median(ceil)
        what = "write+fsync" if name == FS_ROW else "one upload of the same size"
        print(
            f"  {name}, {mib} MiB: durable save / {what} measured just before it: "
            f"{pairs}; best {max(ours):.2f} vs {top:.2f} GB/s ({max(ours) / top:.0%}), "
            f"median {statistics.median(ours):.2f} vs {median:.2f} GB/s "
            f"({statistics.median(ours) / median:.0%}); once staged, the writer reaches best "
            f"{max(writer):.2f} GB/s ({max(writer) / top:.0%}), median "
            f"{statistics.median(writer):.2f} GB/s ({statistics.median(writer) / median:.0%}); "
            f"blocked median {r['blocked median ms']:.1f} ms; all tiers "
            f"{r['all tiers GB/s']:.2f} GB/s"
            + (
                f"; peer restore {r['peer speedup']:.1f}x faster than the emulated slow "
                "persistent store"
                if "peer speedup" in r
                else ""
            )
        )
    print_tiers(rows, "save (hyperpod), durable in tier", "tier GB/s", "GB/s", ".2f")


def print_tiers(
    rows: list[tuple[str, int, dict[str, Any]]], title: str, key: str, unit: str, fmt: str
) -> None:
    """One markdown table of a per-tier figure of our rows."""
    print()
    print(f"| {'persistent tier':15} | {title:56} | {'size':>8} | {unit:>8} |")
    print(f"|{'-' * 17}|{'-' * 58}|{'-' * 10}:|{'-' * 9}:|")
    for name, mib, r in rows:
        where = "S3" if name == S3_ROW else "directory"
        for tier, v in r.get(key, {}).items():
            print(f"| {where:15} | {tier:56} | {mib:>4} MiB | {v:>8{fmt}} |")


if __name__ == "__main__":
    main()
