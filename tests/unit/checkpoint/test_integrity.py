"""Completeness, checksums and fall-back: a torn or corrupt step never loads as good."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer, layout
from hyperpod_agent.checkpoint.inspect import verify_step

from . import _saver
from .conftest import assert_same, sample_state


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_corrupt_memory_shard_falls_back_to_persistent_naming_the_shard(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = make_ckpt()
    ckpt.save(5, sample_state(5)).wait()
    assert ckpt.memory_dir is not None
    shard = layout.step_dir(ckpt.memory_dir, 5) / layout.data_name(0)
    _flip_byte(shard, 0)
    with caplog.at_level(logging.WARNING):
        got = ckpt.load_latest()
    assert got is not None and got[0] == 5
    assert_same(sample_state(5), got[1])
    assert ckpt.last_restore is not None and ckpt.last_restore.tier == "persistent"
    assert f"{shard}: checksum mismatch in leaf 'model/w'" in caplog.text
    assert ckpt.last_restore.fallbacks[0].startswith("step 5 rank 0: memory tier:")


def test_corrupt_everywhere_falls_back_to_previous_step(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = make_ckpt()
    ckpt.save(1, sample_state(1)).wait()
    ckpt.save(2, sample_state(2)).wait()
    assert ckpt.memory_dir is not None
    for root in (ckpt.memory_dir, tiers["persistent"]):
        (layout.step_dir(root, 2) / layout.data_name(0)).write_bytes(b"short")
    with caplog.at_level(logging.WARNING):
        got = ckpt.load_latest()
    assert got is not None and got[0] == 1
    assert_same(sample_state(1), got[1])
    persistent_shard = layout.step_dir(tiers["persistent"], 2) / layout.data_name(0)
    assert f"{persistent_shard}: size differs from its metadata" in caplog.text


def test_missing_memory_tier_restores_from_persistent(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    import shutil

    ckpt = make_ckpt()
    ckpt.save(9, sample_state(9)).wait()
    shutil.rmtree(tiers["mem1"])
    tiers["mem1"].mkdir()
    got = ckpt.load_latest()
    assert got is not None and got[0] == 9
    assert ckpt.last_restore is not None and ckpt.last_restore.tier == "persistent"


def test_step_without_every_rank_is_not_complete(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    # Rank 1 of 2 never saves step 2: rank 0's shard alone must not make it loadable.
    r0 = make_ckpt(rank=0, world_size=2, commit_timeout=0.2)
    r1 = make_ckpt(rank=1, world_size=2, memory_dir=tiers["mem1"])
    r0.save(1, sample_state(1))
    r1.save(1, sample_state(1)).wait()
    r0.wait()
    with pytest.raises(Exception, match=r"only ranks \[0\] of 2 reached the persistent tier"):
        r0.save(2, sample_state(2)).wait()
    assert not layout.scan(tiers["persistent"])[2].committed
    got = r0.load_latest()
    assert got is not None and got[0] == 1


def test_missing_step_metadata_means_incomplete(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    ckpt = make_ckpt()
    ckpt.save(1, sample_state(1)).wait()
    ckpt.save(2, sample_state(2)).wait()
    (layout.step_dir(tiers["persistent"], 2) / layout.STEP_META).unlink()
    import shutil

    shutil.rmtree(tiers["mem1"])
    tiers["mem1"].mkdir()
    got = ckpt.load_latest()
    assert got is not None and got[0] == 1


def test_kill_9_mid_save_never_yields_a_torn_step(tiers: dict[str, Path]) -> None:
    rnd = random.Random(1234)
    first = 0
    last_durable = -1
    for _ in range(4):
        # One durable step, then kill at a random instant.
        durable = _saver.run_and_kill(
            tiers["persistent"],
            tiers["mem1"],
            first,
            lambda: time.sleep(rnd.uniform(0.0, 0.15)),
        )
        last_durable = max(last_durable, *durable)
        first = last_durable + 1
        reader = Checkpointer(tiers["persistent"], memory_dir=tiers["mem1"])
        memory = reader.memory_dir
        try:
            got = reader.load_latest()
        finally:
            reader.close()
        assert memory is not None
        assert got is not None
        step, state = got
        assert step >= last_durable, "a step reported durable was lost"
        assert_same(_saver.state_for(step), state)
        assert layout.scan(memory), "the saver and the reader share the run's memory tier"
        for root in (tiers["persistent"], memory):
            for s, info in layout.scan(root).items():
                if info.committed or (root == memory and info.ranks):
                    assert verify_step(root, s).ok, f"{root} step {s} complete but torn"
    assert np.all(state["a"] == step)  # type: ignore[index]


def test_checksum_is_zlib_crc32_whichever_implementation_computes_it() -> None:
    import zlib

    data = np.random.default_rng(5).integers(0, 256, (3 << 20) + 7, dtype=np.uint8)
    assert layout.checksum(data) == zlib.crc32(data.data) & 0xFFFFFFFF
    assert layout.checksum(b"") == 0
    assert layout.checksum_backend() in ("zlib-ng", "zlib")
