"""Child process for the kill -9 test: saves a growing sequence of steps until killed."""

from __future__ import annotations

import sys

import numpy as np

from hyperpod_agent.checkpoint import Checkpointer


def state_for(step: int) -> dict[str, object]:
    """A state of ~24 MiB whose every byte is derived from the step."""
    return {
        "a": np.full(3 << 20, step, dtype=np.int64),
        "step": step,
        "b": np.arange(1000, dtype=np.float32) + step,
    }


def main() -> None:
    persistent, memory, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ckpt = Checkpointer(persistent, memory_dir=memory, keep_memory=2, keep_persistent=2)
    step = first
    while True:
        ckpt.save(step, state_for(step)).wait()
        print(f"durable {step}", flush=True)
        step += 1


if __name__ == "__main__":
    main()
