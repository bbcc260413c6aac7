"""Which S3 client for the persistent tier: boto3 (s3transfer) against obstore, measured.

One run starts one real S3 server (``rclone serve s3`` over a directory in /dev/shm, so no
disk is measured) and, for each object size, runs every client variant against it, side by
side. Each measurement runs in a fresh process: its peak extra memory is VmHWM after the
operation minus VmRSS before it (the peak is reset first through /proc/self/clear_refs), its
CPU is the process's user + system time; the buffer being uploaded or downloaded into is
allocated and touched before, so only the client's own memory counts.

Variants:
- ``boto3 s3transfer``: ``upload_fileobj`` / ``download_fileobj`` with a TransferConfig (the
  library's own parallel multipart upload and parallel ranged download);
- ``S3Store (boto3)``: hyperpod_agent.checkpoint.s3store over boto3: its threads call
  ``upload_part`` with zero-copy views of the buffer (one ``sendall`` per part) and ranged
  ``get_object`` read into the buffer 1 MiB at a time;
- ``obstore``: ``put`` of the buffer (its own parallel multipart upload), ``get`` streamed
  into the buffer on one connection, and our threads calling ``get_range``.

    .venv/bin/python bench/s3_clients.py                  # 256 MiB and 1 GiB (docs/benchmarks.md)
    .venv/bin/python bench/s3_clients.py --sizes 64 --reps 1   # smoke run
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.s3_proxy import FaultProxy  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402

MiB = 1 << 20
# No MD5 ETag and no re-reading of each upload to check it: the fastest rclone gets here.
# It is still the bottleneck of uploads, so the client CPU is the figure to compare.
SERVER_ARGS = ("--etag-hash", "", "--ignore-checksum")
BUCKET = "ckpt"
OPS = {
    "boto3 s3transfer": ("upload", "download"),
    "S3Store (boto3)": ("upload", "ranged"),
    "obstore": ("upload", "download", "ranged"),
}
OP_LABEL = {
    "upload": "upload (parallel multipart)",
    "download": "download (library's own)",
    "ranged": "download (our parallel ranged GETs)",
}


class _File(io.RawIOBase):
    """A seekable file over a buffer (what s3transfer uploads from and downloads into)."""

    def __init__(self, view: memoryview):
        self.view, self.pos = view, 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, len(self.view))[whence]
        self.pos = base + offset
        return self.pos


class _Reader(_File):
    """Reads are views of the buffer, not copies."""

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> Any:
        end = len(self.view) if n is None or n < 0 else min(len(self.view), self.pos + n)
        out = self.view[self.pos : end]
        self.pos = end
        return out


class _Writer(_File):
    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = len(data)
        self.view[self.pos : self.pos + n] = data
        self.pos += n
        return n


def _ranges(size: int, part: int) -> list[tuple[int, int]]:
    return [(o, min(part, size - o)) for o in range(0, size, part)]


def run_op(
    variant: str, op: str, key: str, buf: np.ndarray, part: int, conc: int
) -> Callable[[], None]:
    """The operation to time, with its client built beforehand."""
    view = memoryview(buf).cast("B")
    size = len(view)
    if variant == "S3Store (boto3)":
        from hyperpod_agent.checkpoint.s3config import S3Options
        from hyperpod_agent.checkpoint.s3store import S3Store as Store

        ours = Store(
            f"s3://{BUCKET}",
            S3Options(part_size=part, multipart_threshold=part, concurrency=conc),
        )
        if op == "upload":
            return lambda: ours.put(key, buf) and None
        return lambda: ours.read_into(key, buf, size=size)
    if variant == "boto3 s3transfer":
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        # As the store: no checksums of ours (servers send the whole object's on ranged
        # answers, which botocore would then reject).
        client = boto3.client(
            "s3",
            config=Config(
                max_pool_connections=conc + 2,
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        tc = TransferConfig(
            multipart_threshold=part, multipart_chunksize=part, max_concurrency=conc
        )
        if op == "upload":
            return lambda: client.upload_fileobj(_Reader(view), BUCKET, key, Config=tc)
        return lambda: client.download_fileobj(BUCKET, key, _Writer(view), Config=tc)

    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, client_options={"allow_http": True})
    if op == "upload":
        return lambda: obstore.put(store, key, buf, chunk_size=part, max_concurrency=conc) and None

    def download() -> None:
        pos = 0
        for chunk in obstore.get(store, key).stream(min_chunk_size=part):
            n = len(chunk)
            view[pos : pos + n] = chunk
            pos += n

    def get_range(off: int, ln: int) -> None:
        view[off : off + ln] = obstore.get_range(store, key, start=off, length=ln)

    def ranged() -> None:
        with ThreadPoolExecutor(conc) as ex:
            list(ex.map(lambda r: get_range(*r), _ranges(size, part)))

    return download if op == "download" else ranged


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def worker(variant: str, op: str, size: int, key: str, part: int, conc: int) -> None:
    """Run one operation in this process and print its figures as JSON."""
    buf = np.empty(size, dtype=np.uint8)
    words = buf.view(np.uint64)
    words[:] = np.arange(len(words), dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    fn = run_op(variant, op, key, buf, part, conc)
    runs = 2
    expect = None
    if op != "upload":  # downloads must reproduce the object
        expect = zlib.crc32(buf)
        fn()  # untimed: the server's first read of a freshly written object is slower
        runs += 1
        buf[:] = 0
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = _status("VmRSS")
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    rss = _status("VmHWM") - base
    if expect is not None and zlib.crc32(buf) != expect:
        raise SystemExit(f"{variant} {op}: downloaded bytes differ from the object")
    # Training goes on while a checkpoint uploads: how fast does a pure-Python thread run
    # during the transfer, against alone, and how fast is the transfer beside it?
    alone = _spin_rate(lambda: time.sleep(0.5))
    busy: list[float] = []
    python = _spin_rate(lambda: busy.append(_timed(fn))) / alone
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    print(
        json.dumps(
            {
                "seconds": t1 - t0,
                "cpu": cpu,
                "rss": rss,
                "busy": busy[0],
                "python": python,
                "runs": runs,
            }
        )
    )


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _spin_rate(work: Callable[[], None]) -> float:
    """Iterations per second of a pure-Python loop in the main thread while ``work`` runs."""
    done = threading.Event()
    t = threading.Thread(target=lambda: (work(), done.set()), daemon=True)
    n, t0 = 0, time.perf_counter()
    t.start()
    while not done.is_set():
        for _ in range(1000):
            n += 1
    t.join()
    return n / (time.perf_counter() - t0)


def measure(
    srv: S3Server,
    proxy: FaultProxy,
    variant: str,
    op: str,
    size: int,
    key: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One operation in a fresh process; the server's CPU per transfer alongside."""
    # rclone answers a ranged GET with 200 and Content-Range; obstore insists on 206, so
    # every client's ranged GETs go through the same proxy that says 206.
    env = {**os.environ, **srv.env(proxy.url if op == "ranged" else None)}
    cmd = [sys.executable, __file__, "--worker", variant, op, str(size), key]
    cmd += ["--part-mib", str(args.part_mib), "--concurrency", str(args.concurrency)]
    c0 = srv.cpu_seconds()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if out.returncode:
        raise SystemExit(f"{variant} {op} {size}: failed:\n{out.stderr[-3000:]}")
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    res["server_cpu"] = (srv.cpu_seconds() - c0) / res["runs"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="256,1024", help="object sizes in MiB (comma-separated)")
    ap.add_argument("--reps", type=int, default=3, help="rounds over every client and operation")
    ap.add_argument("--part-mib", type=int, default=16, help="multipart part and range size")
    ap.add_argument("--concurrency", type=int, default=8, help="parallel requests per transfer")
    ap.add_argument("--worker", nargs=4, metavar=("VARIANT", "OP", "BYTES", "KEY"))
    args = ap.parse_args()
    part = args.part_mib * MiB
    if args.worker:
        variant, op, size, key = args.worker
        worker(variant, op, int(size), key, part, args.concurrency)
        return
    sizes = [int(s) * MiB for s in args.sizes.split(",")]
    t_start = time.monotonic()
    runs: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    pairs = [(v, o) for v, ops in OPS.items() for o in ops]
    with (
        tempfile.TemporaryDirectory(dir="/dev/shm") as d,
        S3Server(Path(d), extra_args=SERVER_ARGS) as srv,
        FaultProxy(srv.port, partial_status=True) as proxy,
    ):
        for size in sizes:
            src = f"bench/{size // MiB}/source"
            measure(srv, proxy, "S3Store (boto3)", "upload", size, src, args)  # what downloads read
            # Rounds, the order reversed every other one: the shared machine drifts, and
            # every client should see the same drift.
            for rnd in range(args.reps):
                for variant, op in pairs if rnd % 2 == 0 else pairs[::-1]:
                    key = src if op != "upload" else f"bench/{size // MiB}/{variant}"
                    res = measure(srv, proxy, variant, op, size, key, args)
                    runs.setdefault((size, variant, op), []).append(res)
                    print(
                        f"  {size // MiB} MiB {variant} {op}: {res['seconds']:.2f} s",
                        file=sys.stderr,
                    )
    report(runs, args, time.monotonic() - t_start)


def report(
    runs: dict[tuple[int, str, str], list[dict[str, Any]]], args: argparse.Namespace, took: float
) -> None:
    """Print the table and the ratios (Markdown, for docs/benchmarks.md)."""
    print(
        f"\nS3 clients against rclone serve s3 on loopback (objects on tmpfs); parts and ranges "
        f"{args.part_mib} MiB, {args.concurrency} requests in parallel; {args.reps} rounds, "
        f"each operation in a fresh process; {os.cpu_count()} CPUs; {took:.0f} s\n"
    )
    print(
        "| size | operation | client | GB/s best | GB/s median | client CPU s/GiB "
        "| server CPU s/GiB | peak extra RSS MiB | GB/s beside busy Python | its speed |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")

    def med(size: int, variant: str, op: str, field: str) -> float:
        return statistics.median(r[field] for r in runs[(size, variant, op)])

    order = list(OP_LABEL)
    for size, variant, op in sorted(runs, key=lambda k: (k[0], order.index(k[2]))):
        rs = runs[(size, variant, op)]
        gib = size / (1 << 30)
        print(
            f"| {size // MiB} MiB | {OP_LABEL[op]} | {variant} "
            f"| {size / min(r['seconds'] for r in rs) / 1e9:.2f} "
            f"| {size / med(size, variant, op, 'seconds') / 1e9:.2f} "
            f"| {med(size, variant, op, 'cpu') / gib:.2f} "
            f"| {med(size, variant, op, 'server_cpu') / gib:.2f} "
            f"| {max(r['rss'] for r in rs) / MiB:.0f} "
            f"| {size / med(size, variant, op, 'busy') / 1e9:.2f} "
            f"| {med(size, variant, op, 'python'):.0%} |"
        )
    print("\nRatios, medians (obstore / boto3 for throughput, boto3 / obstore for client CPU):")
    for size in sorted({k[0] for k in runs}):
        for op, other in (
            ("upload", "boto3 s3transfer"),
            ("upload", "S3Store (boto3)"),
            ("ranged", "S3Store (boto3)"),
            ("download", "boto3 s3transfer"),
        ):
            if (size, "obstore", op) not in runs or (size, other, op) not in runs:
                continue
            ours, theirs = med(size, "obstore", op, "seconds"), med(size, other, op, "seconds")
            busy = med(size, other, op, "busy") / med(size, "obstore", op, "busy")
            cpu = med(size, other, op, "cpu") / med(size, "obstore", op, "cpu")
            print(
                f"- {size // MiB} MiB {op}, obstore vs {other}: throughput {theirs / ours:.2f}x, "
                f"beside busy Python {busy:.2f}x; client CPU {cpu:.2f}x"
            )


if __name__ == "__main__":
    main()
