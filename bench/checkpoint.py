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

The measurement helpers and ceilings are in checkpoint_measure.py, the printed report in
checkpoint_report.py.
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

# Siblings: the script's own directory is first on sys.path when it runs as a script.
from checkpoint_measure import (  # noqa: E402
    MiB,
    aligned,
    best,
    ceilings,
    make_state,
    settle,
    throttle_reads,
    timed,
    write_fsync,
)
from checkpoint_report import FS_ROW, S3_ROW, print_report  # noqa: E402

from hyperpod_agent.checkpoint import Checkpointer, ReplicaServer, fastio, layout  # noqa: E402
from hyperpod_agent.checkpoint.s3store import S3Store  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402

# No MD5 ETag and no re-reading of each upload (bench/s3_clients.py): rclone's fastest.
S3_SERVER_ARGS = ("--etag-hash", "", "--ignore-checksum")
DIRECT_IO = True  # --writer


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
    print_report(rows)


if __name__ == "__main__":
    main()
