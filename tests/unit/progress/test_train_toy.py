"""The toy trainer (examples/train_toy.py) as real processes, one per rank, without Slurm:
its progress records, its file-based gradient averaging (``--sync``) and its straggler
option."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer
from hyperpod_agent.localcluster.drill import parse_train_log
from hyperpod_agent.progress import format as fmt

from .conftest import JOB, REPO, read_consistent

TOY = REPO / "examples" / "train_toy.py"


def toy() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_toy", TOY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Ranks:
    """The tasks of one launch of the toy trainer."""

    def __init__(self, base: Path, world: int) -> None:
        self.base, self.world = base, world
        self.procs: list[subprocess.Popen[str]] = []

    def env(self, rank: int) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": str(REPO),
            "SLURM_JOB_ID": str(JOB),
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": str(self.world),
            "HYPERPOD_CHECKPOINT_DIR": str(self.base / "persistent"),
            "HYPERPOD_CHECKPOINT_MEMORY_DIR": str(self.base / "memory"),
            fmt.ROOT_ENV: str(self.base / "progress"),
        }

    def start(self, *args: str, ranks: list[int] | None = None) -> Ranks:
        for rank in range(self.world) if ranks is None else ranks:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(TOY), *args],
                    env=self.env(rank),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        return self

    def finish(self, timeout: float = 120) -> list[tuple[int, str, str]]:
        results = []
        for p in self.procs:
            out, err = p.communicate(timeout=timeout)
            results.append((p.returncode, out, err))
        return results

    def record(self, rank: int) -> fmt.Record:
        return read_consistent(fmt.record_path(self.base / "progress", JOB, rank))

    def wait_step(self, rank: int, step: int, timeout: float = 60) -> fmt.Record:
        path = fmt.record_path(self.base / "progress", JOB, rank)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and (rec := self.record(rank)).step >= step:
                return rec
            time.sleep(0.02)
        raise AssertionError(f"rank {rank} never reached step {step}")

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.communicate(timeout=30)

    def freeze(self, rank: int, tries: int = 20) -> int:
        """SIGSTOP ``rank`` outside a write of its record; returns its last step."""
        p = self.procs[rank]
        for _ in range(tries):
            p.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 10
            while stat_state(p.pid) != "T" and time.monotonic() < deadline:
                time.sleep(0.005)
            try:
                return read_consistent(
                    fmt.record_path(self.base / "progress", JOB, rank), tries=100
                ).step
            except AssertionError:  # stopped in the middle of a write: let it finish
                p.send_signal(signal.SIGCONT)
                time.sleep(0.01)
        raise AssertionError(f"rank {rank}: could not stop it outside a write")


def stat_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


Launcher = Callable[[int], Ranks]


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[Launcher]:
    launched: list[Ranks] = []

    def make(world: int) -> Ranks:
        launched.append(Ranks(tmp_path, world))
        return launched[-1]

    yield make
    for r in launched:
        r.kill()


def saved_w(base: Path, world: int, rank: int, step: int) -> np.ndarray:
    c = Checkpointer(base / "persistent", memory_dir=base / "m2", rank=rank, world_size=world)
    try:
        return np.asarray(c.load(step)["w"])
    finally:
        c.close()


def test_alone_it_prints_what_it_printed_and_records_every_step(ranks: Launcher) -> None:
    r = ranks(1).start("--steps", "6", "--ckpt-every", "3", "--step-time", "0")
    ((code, out, err),) = r.finish()
    assert code == 0, err
    log = parse_train_log("attempt 1 on n1 at 1.0\n" + out)
    assert [s for s, _ in log.attempts[0].steps] == [1, 2, 3, 4, 5, 6] and log.done_step == 6
    assert out.splitlines()[0].startswith("fresh start at=")
    rec = r.record(0)
    assert (rec.step, rec.total, rec.paused) == (6, 5, False)


def test_sync_averages_the_gradients_of_every_rank(ranks: Launcher, tmp_path: Path) -> None:
    steps, lr = 6, 0.05
    sync = tmp_path / "sync"
    r = ranks(2).start("--steps", str(steps), "--ckpt-every", "3", "--step-time", "0",
                       "--sync", str(sync))  # fmt: skip
    for code, _, err in r.finish():
        assert code == 0, err
    m = toy()
    w = np.zeros(m.DIM)
    for step in range(1, steps + 1):
        grads = []
        for rank in range(2):
            x, y = m.batch(step, rank)
            grads.append((x.T @ (x @ w - y)) / len(y))
        w = w - lr * (grads[0] + grads[1]) / 2
    for rank in range(2):
        np.testing.assert_allclose(saved_w(tmp_path, 2, rank, steps), w, rtol=1e-12)
    left = sorted(p.name for p in sync.rglob("*") if p.is_file())
    assert left == [f"step-{steps:010d}.rank-0.npy", f"step-{steps:010d}.rank-1.npy"], (
        "older steps' files are removed"
    )


def test_without_sync_the_ranks_train_apart(ranks: Launcher, tmp_path: Path) -> None:
    r = ranks(2).start("--steps", "3", "--ckpt-every", "3", "--step-time", "0")
    for code, _, err in r.finish():
        assert code == 0, err
    assert not np.allclose(saved_w(tmp_path, 2, 0, 3), saved_w(tmp_path, 2, 1, 3))


def test_with_sync_one_frozen_rank_stops_every_rank(ranks: Launcher, tmp_path: Path) -> None:
    r = ranks(2).start("--steps", "100000", "--ckpt-every", "100000", "--step-time", "0.02",
                       "--sync", str(tmp_path / "sync"))  # fmt: skip
    r.wait_step(0, 3)
    r.wait_step(1, 3)
    frozen = r.freeze(1)
    # Rank 0 may finish the step rank 1 was in, never the next: give it the time of
    # many steps to (wrongly) go on.
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        assert r.record(0).step <= frozen + 1
        time.sleep(0.05)
    assert r.record(1).step == frozen
    rec = r.record(0)
    assert not rec.paused, "waiting for the others is not a paused phase"
    r.procs[1].send_signal(signal.SIGCONT)
    r.wait_step(0, frozen + 5)
    r.wait_step(1, frozen + 5)


def test_sync_gives_up_after_its_timeout(ranks: Launcher, tmp_path: Path) -> None:
    r = ranks(2).start("--steps", "5", "--step-time", "0", "--sync", str(tmp_path / "sync"),
                       "--sync-timeout", "1", ranks=[0])  # fmt: skip
    ((code, out, err),) = r.finish()
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        "train_toy: rank 0: step 1: rank(s) 1 did not arrive within 1 s"
    )


def test_a_slow_rank_takes_factor_times_longer(ranks: Launcher) -> None:
    r = ranks(2).start("--steps", "4", "--ckpt-every", "100", "--step-time", "0.05",
                       "--slow-rank", "1", "--slow-factor", "4")  # fmt: skip
    for code, _, err in r.finish():
        assert code == 0, err
    slow, normal = r.record(1), r.record(0)
    assert slow.total == normal.total == 3
    assert min(slow.durations) >= 0.2 and min(normal.durations) >= 0.05


def test_pause_at_spends_a_paused_phase_after_that_step(ranks: Launcher) -> None:
    r = ranks(1).start("--steps", "100000", "--ckpt-every", "100000", "--step-time", "0.01",
                       "--pause-at", "3", "--pause-for", "30")  # fmt: skip
    r.wait_step(0, 3)
    deadline = time.monotonic() + 10
    while not (rec := r.record(0)).paused and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rec.paused and rec.pause_reason == "evaluation" and rec.step == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pause-at", "3", "--pause-for", "-1"], "--pause-for: must be >= 0"),
        (["--slow-factor", "0", "--slow-rank", "0"], "--slow-factor: must be > 0"),
        (["--sync-timeout", "-1", "--sync", "/tmp"], "--sync-timeout: must be > 0"),
        (["--slow-factor", "2"], "--slow-factor needs --slow-rank"),
    ],
)
def test_bad_options_are_one_line_errors(ranks: Launcher, args: list[str], message: str) -> None:
    r = ranks(1).start(*args)
    ((code, _, err),) = r.finish()
    assert code == 2 and message in err.strip().splitlines()[-1]
