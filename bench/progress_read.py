"""What reading the training ranks' progress records costs the agent per cycle.

Writes N valid records (N = 8, 64, 256 by default) into a fresh directory on /dev/shm
(the tmpfs the records live on in production), each naming a live process, and times
three things side by side on the same files, interleaved cycle by cycle:

- ``reader``: ``ProgressReader.read()``, all the agent does per cycle (checks, seqlock
  read, /proc lookups, summaries, the report models);
- ``files``: only opening and reading the records (``read_record`` on every file);
- ``report``: the summaries serialised as the reporter sends them (``model_dump``).

    .venv/bin/python bench/progress_read.py
    .venv/bin/python bench/progress_read.py --ranks 8 64 256 --cycles 300
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hyperpod_agent.agent.progress_files import OPEN_DIR, read_record
from hyperpod_agent.agent.progress_reader import ProgressReader
from hyperpod_agent.progress import format as pf


def write_records(root: Path, job_id: int, ranks: int, pid: int) -> None:
    """``ranks`` records of a job in mid-run: full rings, a step just finished."""
    now = time.time()
    for rank in range(ranks):
        buf = bytearray(pf.SIZE)
        pf.HEADER.pack_into(buf, 0, pf.MAGIC, pf.VERSION, 2)
        pf.IDENTITY.pack_into(buf, pf.IDENTITY_OFFSET, pid, job_id, rank)
        pf.STATE.pack_into(buf, pf.STATE_OFFSET, 0, now - 600, 1000, now, 0.0, b"", 0.0, 0.0)
        pf.TOTAL.pack_into(buf, pf.TOTAL_OFFSET, 1000)
        for slot in range(pf.RING):
            pf.DURATION.pack_into(buf, pf.RING_OFFSET + 4 * slot, 0.5 + slot / 1000)
        path = pf.record_path(root, job_id, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(buf))


def files_only(root: Path, job_id: int) -> Callable[[], None]:
    def run() -> None:
        fd = os.open(root / str(job_id), OPEN_DIR)
        try:
            for name in os.listdir(fd):
                read_record(fd, name)
        finally:
            os.close(fd)

    return run


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1000.0


def measure(ranks: int, cycles: int, pid: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="hyperpod-progress-bench-", dir="/dev/shm"))
    try:
        write_records(root, 1001, ranks, pid)
        reader = ProgressReader(root)
        jobs = reader.read()
        assert len(jobs) == 1 and len(jobs[0].ranks) == ranks, "every record must be read"
        variants: dict[str, Callable[[], object]] = {
            "reader": reader.read,
            "files": files_only(root, 1001),
            "report": lambda: [j.model_dump(mode="json") for j in jobs],
        }
        samples: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(max(3, cycles // 10)):  # warm-up
            for fn in variants.values():
                fn()
        for _ in range(cycles):
            for name, fn in variants.items():
                samples[name].append(timed(fn))
        out: dict[str, float] = {"ranks": ranks}
        for name, values in samples.items():
            values.sort()
            out[f"{name}_p50"] = statistics.median(values)
            out[f"{name}_p90"] = values[int(0.9 * (len(values) - 1))]
        out["report_bytes"] = len(json.dumps([j.model_dump(mode="json") for j in jobs]))
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--cycles", type=int, default=300)
    args = parser.parse_args()
    if any(not 1 <= n <= 256 for n in args.ranks):
        parser.error("--ranks: each between 1 and 256 (one job's ranks on a node)")
    sleeper = subprocess.Popen(["sleep", "3600"])
    try:
        rows = [measure(n, args.cycles, sleeper.pid) for n in args.ranks]
    finally:
        sleeper.kill()
        sleeper.wait(10)
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"Linux {platform.release()}; {args.cycles} cycles per size, median (p90)"
    )
    print(
        "| ranks | reader µs/cycle | µs/rank | files only µs/cycle "
        "| report model_dump µs | report JSON bytes |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['ranks']:.0f} | {r['reader_p50']:.0f} ({r['reader_p90']:.0f}) "
            f"| {r['reader_p50'] / r['ranks']:.1f} "
            f"| {r['files_p50']:.0f} ({r['files_p90']:.0f}) "
            f"| {r['report_p50']:.0f} ({r['report_p90']:.0f}) | {r['report_bytes']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
