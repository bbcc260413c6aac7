"""Child process for the kill -9 tests: saves a growing sequence of steps until killed.

    python -m tests.unit.checkpoint._saver PERSISTENT MEMORY FIRST_STEP [PART_MIB]

PERSISTENT is a directory or an ``s3://`` URL (the AWS variables come from the
environment); PART_MIB sets the object store's part size and multipart threshold, so that
a small state is uploaded in several parts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hyperpod_agent.checkpoint import Checkpointer
from hyperpod_agent.checkpoint.s3config import MiB, S3Options


def state_for(step: int) -> dict[str, object]:
    """A state of ~24 MiB whose every byte is derived from the step."""
    return {
        "a": np.full(3 << 20, step, dtype=np.int64),
        "step": step,
        "b": np.arange(1000, dtype=np.float32) + step,
    }


def run_and_kill(
    persistent: str | Path,
    memory: Path,
    first: int,
    before_kill: Callable[[], None],
    part_mib: int | None = None,
) -> list[int]:
    """Start a saver, let it report one durable step, call ``before_kill`` and SIGKILL it;
    return every step it reported durable."""
    root = Path(__file__).parents[3]
    argv = [sys.executable, "-m", "tests.unit.checkpoint._saver", str(persistent), str(memory)]
    argv += [str(first)] + ([str(part_mib)] if part_mib else [])
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("durable"), line
        before_kill()
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return [int(x.split()[1]) for x in [line, *out.splitlines()]]


def main() -> None:
    persistent, memory, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
    opts = None
    if len(sys.argv) > 4:
        part = int(sys.argv[4]) * MiB
        opts = S3Options(part_size=part, multipart_threshold=part, concurrency=2)
    ckpt = Checkpointer(
        persistent, memory_dir=memory, keep_memory=2, keep_persistent=2, s3_options=opts
    )
    step = first
    while True:
        ckpt.save(step, state_for(step)).wait()
        print(f"durable {step}", flush=True)
        step += 1


if __name__ == "__main__":
    main()
