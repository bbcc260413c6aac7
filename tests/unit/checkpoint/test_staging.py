"""Saves stage straight into the memory tier's files, and those files are recycled."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer, layout
from hyperpod_agent.shared_root import SPARE_PREFIX

from .conftest import assert_same


def state(step: int, n: int = 4096) -> dict[str, np.ndarray]:
    return {"w": np.full(n, step, dtype=np.float32), "b": np.arange(step, dtype=np.int16)}


def inode(path: Path) -> int:
    return os.stat(path).st_ino


def mem(ckpt: Checkpointer) -> Path:
    """The run's memory tier directory."""
    assert ckpt.memory_dir is not None
    return ckpt.memory_dir


def spares(root: Path, rank: int = 0) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith(f"{SPARE_PREFIX}{rank:05d}-"))


def test_memory_tier_file_is_the_staging_file_and_files_are_recycled(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    ckpt = make_ckpt(keep_memory=1)
    seen: set[int] = set()
    for step in range(1, 7):
        ckpt.save(step, state(step)).wait()
        data = layout.step_dir(mem(ckpt), step) / layout.data_name(0)
        seen.add(inode(data))
        # retention keeps one step; the file it dropped waits as the next staging file (after
        # the first save, a spare is prepared in the background)
        assert sorted(layout.scan(mem(ckpt))) == [step]
        assert len(spares(mem(ckpt))) == 1
    assert len(seen) == 2, "two files alternate: the kept step and the one being written"
    got = ckpt.load_latest(state(6))
    assert got is not None and got[0] == 6
    assert ckpt.last_restore is not None and ckpt.last_restore.tier == "memory"
    assert_same(got[1], state(6))


def test_state_size_change_resizes_the_recycled_file(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    ckpt = make_ckpt(keep_memory=1)
    for step, n in ((1, 4096), (2, 100), (3, 100_000), (4, 0)):
        ckpt.save(step, state(step, n)).wait()
        data = layout.step_dir(mem(ckpt), step) / layout.data_name(0)
        meta = layout.read_json(data.with_suffix(".json"))
        assert data.stat().st_size == meta["data_size"]
        got = ckpt.load(step, state(step, n))
        assert_same(got, state(step, n))


def test_wiped_memory_tier_between_saves_releases_the_old_mapping(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    ckpt = make_ckpt(keep_memory=1)
    for step in range(1, 5):
        ckpt.save(step, state(step)).wait()
        for p in tiers["mem1"].iterdir():  # an operator (or a node reboot) empties /dev/shm
            shutil.rmtree(p)
    ckpt.save(5, state(5)).wait()
    # only live files stay mapped: step 5's and the spare prepared after it
    assert len(ckpt._pool._slots) == 2
    assert len(spares(mem(ckpt))) == 1
    got = ckpt.load_latest(state(5))
    assert got is not None and got[0] == 5 and ckpt.last_restore.tier == "memory"


def test_spares_left_by_a_dead_process_are_removed_on_the_first_save(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    reader = make_ckpt()
    mine = mem(reader) / f"{SPARE_PREFIX}00000-deadbeef0000"
    other = mem(reader) / f"{SPARE_PREFIX}00001-deadbeef0000"
    mine.write_bytes(b"x" * 100)
    other.write_bytes(b"x" * 100)
    assert reader.load_latest() is None
    assert mine.exists(), "a reader must not touch the memory tier"
    reader.save(1, state(1)).wait()
    assert not mine.exists()
    assert other.exists(), "another rank's spare is not ours to remove"


def test_close_removes_spares_and_keeps_published_steps(tiers: dict[str, Path]) -> None:
    ckpt = Checkpointer(tiers["persistent"], memory_dir=tiers["mem1"], keep_memory=1)
    for step in (1, 2):
        ckpt.save(step, state(step)).wait()
    assert spares(mem(ckpt))
    ckpt.close()
    assert spares(mem(ckpt)) == []
    assert sorted(layout.scan(mem(ckpt))) == [2]


@pytest.mark.root
def test_full_memory_tier_fails_that_tier_only_and_training_never_sees_sigbus(
    small_tmpfs: Path, tiers: dict[str, Path]
) -> None:
    ckpt = Checkpointer(tiers["persistent"], memory_dir=small_tmpfs)
    try:
        big = {"w": np.ones(1 << 20, dtype=np.float32)}  # 4 MiB: does not fit in 1 MiB
        h = ckpt.save(1, big)
        with pytest.raises(Exception, match=r"memory tier failed: no room for a \d+-byte"):
            h.wait()
        assert h._future.result()["persistent"] == "ok"
        got = ckpt.load_latest(big)
        assert got is not None and got[0] == 1 and ckpt.last_restore.tier == "persistent"
        assert_same(got[1], big)
        assert spares(small_tmpfs) == [], "the failed reservation left nothing behind"
        # once the state fits again, the memory tier is used again
        small = {"w": np.ones(1024, dtype=np.float32)}
        ckpt.save(2, small).wait()
        got = ckpt.load_latest(small)
        assert got is not None and got[0] == 2 and ckpt.last_restore.tier == "memory"
    finally:
        ckpt.close()


def test_persistent_writer_starts_before_staging_ends(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hyperpod_agent.checkpoint.checkpointer as mod

    real_copy = mod.copy_leaf
    seen: list[int] = []

    def copy_and_watch(leaf, buf):  # type: ignore[no-untyped-def]
        if leaf.path == "z_last":
            # The first leaf (8 MiB) must reach the persistent tier's temporary file while
            # this last leaf has not been copied yet.
            d = layout.step_dir(tiers["persistent"], 1)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not seen:
                for p in d.glob(".tmp-rank-00000.bin-*") if d.exists() else []:
                    try:
                        if p.stat().st_size >= 8 << 20:
                            seen.append(p.stat().st_size)
                    except FileNotFoundError:
                        pass
                time.sleep(0.01)
        real_copy(leaf, buf)

    monkeypatch.setattr(mod, "copy_leaf", copy_and_watch)
    state = {"a_first": np.ones(2 << 20, dtype=np.float32), "z_last": np.zeros(10, np.int8)}
    ckpt = make_ckpt(overlap=True)
    ckpt.save(1, state).wait()
    assert seen, "the persistent writer waited for the whole state to be staged"
    got = ckpt.load_latest(state)
    assert got is not None
    assert_same(got[1], state)


def test_failure_while_staging_publishes_nothing_and_the_next_save_works(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hyperpod_agent.checkpoint.checkpointer as mod

    real_copy = mod.copy_leaf

    def broken(leaf, buf):  # type: ignore[no-untyped-def]
        if leaf.path == "z_last":
            raise RuntimeError("device lost during copy")
        real_copy(leaf, buf)

    state = {"a_first": np.ones(2 << 20, dtype=np.float32), "z_last": np.zeros(10, np.int8)}
    ckpt = make_ckpt()
    ckpt.save(1, state).wait()
    monkeypatch.setattr(mod, "copy_leaf", broken)
    with pytest.raises(RuntimeError, match="device lost"):
        ckpt.save(2, state)
    monkeypatch.setattr(mod, "copy_leaf", real_copy)
    for root in (tiers["persistent"], mem(ckpt)):
        assert 2 not in layout.scan(root) or not layout.scan(root)[2].ranks
        assert not list(root.rglob(".tmp-*")), f"{root}: a temporary file was left"
    got = ckpt.load_latest(state)
    assert got is not None and got[0] == 1
    ckpt.save(3, state).wait()
    got = ckpt.load_latest(state)
    assert got is not None and got[0] == 3 and ckpt.last_restore.tier == "memory"
