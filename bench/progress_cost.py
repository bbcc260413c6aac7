"""What recording progress costs a training step (hyperpod_agent.progress).

In one process, side by side: the median over several batches of the cost per call of
``progress.step`` recording to a record on /dev/shm (as on a node), a ``pause`` +
``resume`` pair, a ``with progress.paused(...)`` block, ``progress.step`` outside a job
(the no-op), and as references ``time.time()`` and an empty loop iteration (included in
every figure).

    .venv/bin/python bench/progress_cost.py                        # 7 batches of 200k calls
    .venv/bin/python bench/progress_cost.py --calls 50000 --batches 3

Target: progress.step <= 2 us per call.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hyperpod_agent import progress
from hyperpod_agent.progress import format as fmt

TARGET_NS = 2000.0


def per_call_ns(loop: Callable[[int, int], None], calls: int, batches: int) -> float:
    """Median over ``batches`` of the time per call of ``loop(first, calls)``."""
    times = []
    for b in range(batches):
        t0 = time.perf_counter()
        loop(b * calls, calls)
        times.append((time.perf_counter() - t0) / calls * 1e9)
    return statistics.median(times)


def steps(first: int, calls: int) -> None:
    step = progress.step
    for n in range(first, first + calls):
        step(n)


def pause_resume(first: int, calls: int) -> None:
    pause, resume = progress.pause, progress.resume
    for _ in range(calls):
        pause("evaluation")
        resume()


def paused_block(first: int, calls: int) -> None:
    paused = progress.paused
    for _ in range(calls):
        with paused("evaluation"):
            pass


def clock(first: int, calls: int) -> None:
    now = time.time
    for _ in range(calls):
        now()


def empty(first: int, calls: int) -> None:
    for _ in range(calls):
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per batch")
    parser.add_argument("--batches", type=int, default=7)
    args = parser.parse_args()
    if not 1_000 <= args.calls <= 10_000_000 or not 1 <= args.batches <= 50:
        parser.error("--calls must be in 1000..10000000 and --batches in 1..50")
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(prefix="hp-progress-bench-", dir=shm if shm.is_dir() else None))
    os.environ[fmt.ROOT_ENV] = str(base / "root")
    os.environ["SLURM_JOB_ID"] = str(4_000_000_000 + os.getpid() % 100_000)
    os.environ["SLURM_PROCID"] = "0"
    os.environ.pop("RANK", None)
    rows: list[tuple[str, float]] = []
    try:
        progress.step(0)
        record = progress.path()
        if record is None:
            print(f"progress_cost: could not make a record under {base}", file=sys.stderr)
            return 1
        for name, loop in (
            ("progress.step, recording", steps),
            ("progress.pause + resume", pause_resume),
            ("with progress.paused(...)", paused_block),
        ):
            rows.append((name, per_call_ns(loop, args.calls, args.batches)))
        total = fmt.decode(record.read_bytes()).total
        progress.close()
        del os.environ["SLURM_JOB_ID"]
        rows.append(("progress.step, outside a job", per_call_ns(steps, args.calls, args.batches)))
        assert progress.path() is None
        rows.append(("time.time()", per_call_ns(clock, args.calls, args.batches)))
        rows.append(("empty loop iteration", per_call_ns(empty, args.calls, args.batches)))
    finally:
        progress.close()
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"progress cost per call: median of {args.batches} batches of {args.calls} calls "
        f"(Python {platform.python_version()}, {platform.machine()}, record on {base.parent})"
    )
    reference = dict(rows)["time.time()"]
    print(f"  {'call':<32}{'ns/call':>10}{'x time.time()':>16}")
    for name, ns in rows:
        print(f"  {name:<32}{ns:>10.0f}{ns / reference:>16.1f}")
    step_ns = rows[0][1]
    verdict = "met" if step_ns <= TARGET_NS else "MISSED"
    print(f"target progress.step <= {TARGET_NS:.0f} ns: {verdict} ({total} durations recorded)")
    return 0 if step_ns <= TARGET_NS else 1


if __name__ == "__main__":
    sys.exit(main())
