"""A toy data-parallel training loop that survives node failures.

Each task (one per node under ``srun``) trains a small linear model with NumPy on
data determined by the step number, so a resumed run computes exactly what an
uninterrupted one would. Every ``--ckpt-every`` steps it saves through the
project's checkpoint library (memory tier every save, persistent tier too); on start
it resumes from the newest complete checkpoint and says from which step.

Lines printed by rank 0 (parsed by bench/recovery.py and the demo):
    resume step=<N> at=<epoch>     or    fresh start at=<epoch>
    step=<N> loss=<x> at=<epoch>
    done step=<N> at=<epoch>
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from hyperpod_agent.checkpoint import Checkpointer

DIM = 64


def batch(step: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(step * 1000 + rank)
    x = rng.standard_normal((32, DIM))
    true_w = np.linspace(-1.0, 1.0, DIM)
    return x, x @ true_w + 0.01 * rng.standard_normal(32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument(
        "--step-time", type=float, default=0.5, help="seconds per step (stands in for real compute)"
    )
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))

    def say(text: str) -> None:
        if rank == 0:
            print(f"{text} at={time.time():.3f}", flush=True)

    ckpt = Checkpointer.from_env()
    restored = ckpt.load_latest()
    if restored is None:
        start, w = 0, np.zeros(DIM)
        say("fresh start")
    else:
        start, state = restored
        w = np.asarray(state["w"])
        say(f"resume step={start} restarts={os.environ.get('SLURM_RESTART_COUNT', '0')}")
    for step in range(start + 1, args.steps + 1):
        x, y = batch(step, rank)
        err = x @ w - y
        w = w - args.lr * (x.T @ err) / len(y)
        time.sleep(args.step_time)
        say(f"step={step} loss={float(np.mean(err**2)):.5f}")
        if step % args.ckpt_every == 0:
            ckpt.save(step, {"w": w, "step": np.int64(step)})
    ckpt.wait()
    ckpt.close()
    say(f"done step={args.steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
