"""A commit vouches only for shards of its own save, and survives a crash of the machine."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer, layout

from .conftest import assert_same


def state(rank: int, step: int, launch: int) -> dict[str, np.ndarray]:
    """Distinct for every rank, step and launch, so a mix of two launches is visible."""
    return {"w": np.full(64, rank * 1000 + step * 10 + launch, dtype=np.int64)}


@pytest.fixture
def launches() -> Iterator[list[Checkpointer]]:
    """Checkpointers made by ``make``; a launch is a value of SLURM_RESTART_COUNT."""
    made: list[Checkpointer] = []
    yield made
    for c in made:
        c.close()


def make(
    tmp_path: Path,
    made: list[Checkpointer],
    monkeypatch: pytest.MonkeyPatch,
    rank: int,
    launch: int,
    **kw: object,
) -> Checkpointer:
    # Every task of one launch of a job shares these; a requeue increments the count.
    monkeypatch.setenv("SLURM_JOB_ID", "812")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(launch))
    ckpt = Checkpointer(
        tmp_path / "p",
        memory_dir=tmp_path / f"m{rank}",
        rank=rank,
        world_size=2,
        **kw,  # type: ignore[arg-type]
    )
    made.append(ckpt)
    return ckpt


def test_a_stale_shard_of_an_earlier_launch_is_never_committed(
    tmp_path: Path, launches: list[Checkpointer], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = [make(tmp_path, launches, monkeypatch, r, launch=0) for r in (0, 1)]
    handles = [c.save(5, state(c.rank, 5, 0)) for c in first]
    for h in handles:
        h.wait(timeout=60)
    assert layout.scan(tmp_path / "p")[5].committed
    # The job is requeued and saves step 5 again; rank 1 dies before it writes anything.
    r0 = make(tmp_path, launches, monkeypatch, 0, launch=1, commit_timeout=0.5)
    with pytest.raises(Exception, match=r"only ranks \[0\] of 2 .* \(ranks \[1\] hold files"):
        r0.save(5, state(0, 5, 1)).wait(timeout=60)
    assert not layout.scan(tmp_path / "p")[5].committed, "rank 1's old shard vouched for"


def test_a_restore_refuses_a_shard_rewritten_after_the_commit(
    tmp_path: Path,
    launches: list[Checkpointer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = [make(tmp_path, launches, monkeypatch, r, launch=0) for r in (0, 1)]
    for step in (4, 5):
        handles = [c.save(step, state(c.rank, step, 0)) for c in first]
        for h in handles:
            h.wait(timeout=60)
    # The next launch restored step 4 (say step 5 was unreadable then) and saves step 5 again;
    # the machine dies after rank 1 rewrote its shard, before rank 0 rewrote or committed.
    r1 = make(tmp_path, launches, monkeypatch, 1, launch=1, commit_timeout=0.2)
    r1.save(5, state(1, 5, 1)).wait(timeout=60)
    for r in (0, 1):
        shutil.rmtree(tmp_path / f"m{r}")  # restore from the persistent tier only
    reader = make(tmp_path, launches, monkeypatch, 1, launch=2)
    with caplog.at_level(logging.WARNING):
        got = reader.load_latest()
    assert got is not None and got[0] == 4, "step 5 would mix two launches"
    assert_same(got[1], state(1, 4, 0))
    assert "but step 5 was committed for save" in caplog.text


def test_a_new_step_directory_is_made_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    ckpt = Checkpointer(tmp_path / "p", memory_dir=tmp_path / "m")
    try:
        ckpt.save(3, {"w": np.ones(8)}).wait()
    finally:
        ckpt.close()
    root = str(tmp_path / "p")
    step_dir = str(layout.step_dir(tmp_path / "p", 3))
    persistent = [p for p in synced if p == root or p.startswith(root + "/")]
    # The step directory's entry in the tier root is on disk before anything inside it
    # counts as durable: the root is synced right after the directory is made.
    first = next(i for i, p in enumerate(persistent) if p.startswith(step_dir))
    assert first > 0 and persistent[first - 1] == root, persistent
