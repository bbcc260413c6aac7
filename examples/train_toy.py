"""A toy data-parallel training loop that survives node failures.

Each task (one per node under ``srun``) trains a small linear model with NumPy on
data determined by the step number, so a resumed run computes exactly what an
uninterrupted one would. Every ``--ckpt-every`` steps it saves through the
project's checkpoint library (memory tier every save, persistent tier too); on start
it resumes from the newest complete checkpoint and says from which step.

Every finished step is recorded with ``hyperpod_agent.progress`` (the node agent's hang
and straggler detection reads it; checkpoint saves and loads are paused phases).

Lines printed by rank 0 (parsed by bench/recovery.py and the demo):
    resume step=<N> at=<epoch>     or    fresh start at=<epoch>
    step=<N> loss=<x> at=<epoch>
    done step=<N> at=<epoch>

Options for hang and straggler drills, off by default (the lines above stay the same):
    --sync DIR          a real data-parallel step: the ranks average their gradients
                        through files in DIR (shared by every rank), as an all-reduce
                        would, so one rank that stops (SIGSTOP) stops them all
    --sync-timeout S    how long a rank waits for the others at a step (1800 s), then
                        exits 1 naming the missing ranks, as a collective's timeout would
    --slow-rank R --slow-factor F    rank R's steps take F times --step-time
    --pause-at N --pause-for S       after step N, every rank spends S seconds in a
                        paused phase ("evaluation"), as an evaluation loop would
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from hyperpod_agent import progress
from hyperpod_agent.checkpoint import Checkpointer
from hyperpod_agent.checkpoint.identity import launch_token

DIM = 64
POLL_S = 0.005  # between looks for the other ranks' files: short next to a step


def batch(step: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(step * 1000 + rank)
    x = rng.standard_normal((32, DIM))
    true_w = np.linspace(-1.0, 1.0, DIM)
    return x, x @ true_w + 0.01 * rng.standard_normal(32)


class SyncTimeout(Exception):
    """Some ranks did not bring their part of a step in time."""


class FileAllReduce:
    """The mean of an array over every rank, through files in a directory they share.

    Each launch of the job's tasks uses its own subdirectory (a requeued job never
    averages with files of the attempt before). A rank writes its part of step n
    atomically, then waits for every rank's. Once it has them all, every rank has read
    step n-1's files (it wrote step n only after that), so its own file of n-1 goes.
    """

    def __init__(self, root: Path, rank: int, world: int, timeout: float) -> None:
        self.dir = root / launch_token(os.environ, world)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank, self.world, self.timeout = rank, world, timeout

    def _file(self, step: int, rank: int) -> Path:
        return self.dir / f"step-{step:010d}.rank-{rank}.npy"

    def mean(self, step: int, value: np.ndarray) -> np.ndarray:
        mine = self._file(step, self.rank)
        tmp = mine.with_name(f".{mine.name}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, value)
        os.replace(tmp, mine)
        parts: dict[int, np.ndarray] = {}
        deadline = time.monotonic() + self.timeout
        while True:
            for r in range(self.world):
                if r not in parts:
                    try:
                        parts[r] = np.load(self._file(step, r))
                    except FileNotFoundError:
                        pass
            if len(parts) == self.world:
                break
            if time.monotonic() >= deadline:
                missing = ", ".join(str(r) for r in range(self.world) if r not in parts)
                raise SyncTimeout(
                    f"rank {self.rank}: step {step}: rank(s) {missing} did not arrive "
                    f"within {self.timeout:g} s"
                )
            time.sleep(POLL_S)
        self._file(step - 1, self.rank).unlink(missing_ok=True)
        return sum((parts[r] for r in range(self.world)), np.zeros_like(value)) / self.world


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument(
        "--step-time", type=float, default=0.5, help="seconds per step (stands in for real compute)"
    )
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--sync", type=Path, metavar="DIR", help="average gradients through DIR")
    parser.add_argument("--sync-timeout", type=float, default=1800.0, metavar="S")
    parser.add_argument("--slow-rank", type=int, metavar="R")
    parser.add_argument("--slow-factor", type=float, metavar="F")
    parser.add_argument("--pause-at", type=int, metavar="N")
    parser.add_argument("--pause-for", type=float, default=0.0, metavar="S")
    args = parser.parse_args()
    if args.pause_for < 0:
        parser.error("--pause-for: must be >= 0")
    if args.sync_timeout <= 0:
        parser.error("--sync-timeout: must be > 0")
    if args.slow_factor is not None and args.slow_factor <= 0:
        parser.error("--slow-factor: must be > 0")
    if (args.slow_rank is None) != (args.slow_factor is None):
        parser.error(
            "--slow-factor needs --slow-rank" if args.slow_rank is None
            else "--slow-rank needs --slow-factor"
        )  # fmt: skip
    return args


def main() -> int:
    args = parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    step_time = args.step_time * (args.slow_factor if rank == args.slow_rank else 1.0)

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
    sync = FileAllReduce(args.sync, rank, world, args.sync_timeout) if args.sync else None
    for step in range(start + 1, args.steps + 1):
        x, y = batch(step, rank)
        err = x @ w - y
        time.sleep(step_time)
        if sync is None:
            w = w - args.lr * (x.T @ err) / len(y)
        else:
            try:
                w = w - args.lr * sync.mean(step, (x.T @ err) / len(y))
            except SyncTimeout as exc:
                print(f"train_toy: {exc}", file=sys.stderr, flush=True)
                return 1
        progress.step(step)
        say(f"step={step} loss={float(np.mean(err**2)):.5f}")
        if step == args.pause_at:
            with progress.paused("evaluation"):
                time.sleep(args.pause_for)
        if step % args.ckpt_every == 0:
            ckpt.save(step, {"w": w, "step": np.int64(step)})
    ckpt.wait()
    ckpt.close()
    say(f"done step={args.steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
