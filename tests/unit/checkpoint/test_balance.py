"""Balanced saving: a tensor held by several data-parallel ranks is written once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from hyperpod_agent.checkpoint import Checkpointer, layout
from hyperpod_agent.checkpoint.balance import assign_owners, is_replicated
from hyperpod_agent.checkpoint.inspect import verify_step
from hyperpod_agent.checkpoint.state import flatten

from .conftest import assert_same


def _state(rank: int) -> dict[str, object]:
    return {
        "model": {
            "big": np.ones(4000, np.float32),
            "mid": np.ones(3000, np.float32),
            "small": np.ones(1000, np.float32),
            "tiny": np.ones(10, np.float32),
        },
        "rng": np.array([rank], np.int64),  # differs per rank: never deduplicated
    }


def test_prefix_declares_a_whole_subtree() -> None:
    assert is_replicated("model/layers/0/w", {"model"})
    assert is_replicated("model", {"model"})
    assert not is_replicated("modelx/w", {"model"})
    assert not is_replicated("rng", {"model"})


def test_greedy_assignment_is_deterministic_and_balanced() -> None:
    _, leaves = flatten(_state(0))
    owners = assign_owners(leaves, {"model"}, [0, 1])
    assert owners == {"model/big": 0, "model/mid": 1, "model/small": 1, "model/tiny": 0}
    assert assign_owners(list(reversed(leaves)), {"model"}, [1, 0]) == owners


def test_replicated_tensors_are_written_once_and_every_rank_restores(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    ranks = [
        make_ckpt(rank=r, world_size=2, replicated={"model"}, memory_dir=tiers["mem1"] / str(r))
        for r in (0, 1)
    ]
    handles = [c.save(1, _state(c.rank)) for c in ranks]
    for h in handles:
        h.wait(timeout=60)
    d = layout.step_dir(tiers["persistent"], 1)
    sizes = {r: (d / layout.data_name(r)).stat().st_size for r in (0, 1)}
    model_bytes = (4000 + 3000 + 1000 + 10) * 4
    assert sum(sizes.values()) < model_bytes + 1000  # once, not twice
    assert abs(sizes[0] - sizes[1]) < 1200 * 4
    assert verify_step(tiers["persistent"], 1).ok
    for c in ranks:
        (layout.step_dir(c.memory_dir, 1) / layout.meta_name(c.rank)).unlink()
        got = c.load_latest()
        assert got is not None and c.last_restore is not None
        assert c.last_restore.tier == "persistent"
        assert_same(_state(c.rank), got[1])


def test_missing_owner_shard_is_named(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    ranks = [
        make_ckpt(rank=r, world_size=2, replicated={"model"}, memory_dir=tiers["mem1"] / str(r))
        for r in (0, 1)
    ]
    for h in [c.save(1, _state(c.rank)) for c in ranks]:
        h.wait(timeout=60)
    owner_file = layout.step_dir(tiers["persistent"], 1) / layout.data_name(1)
    with open(owner_file, "r+b") as f:
        f.write(b"\xff" * 64)
    verdict = verify_step(tiers["persistent"], 1)
    assert not verdict.ok and str(owner_file) in verdict.problems[0]
    layout.remove_step(ranks[0].memory_dir, 1)
    assert ranks[0].load_latest() is None
