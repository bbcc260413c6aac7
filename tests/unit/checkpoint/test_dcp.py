"""DCP saves into the persistent tier and finds the newest committed step."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest

from hyperpod_agent.checkpoint import Checkpointer
from hyperpod_agent.checkpoint.dcp import COMMIT, dcp_latest, dcp_root, dcp_steps, dcp_writer


def test_dcp_round_trip_discovery_and_retention(make_ckpt: Callable[..., Checkpointer]) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    ckpt = make_ckpt(keep_persistent=2)
    assert dcp_latest(ckpt) is None
    with warnings.catch_warnings():
        # DCP warns that it runs without a process group: expected in one process.
        warnings.simplefilter("ignore", UserWarning)
        for step in (1, 2, 3):
            state = {"w": torch.full((4, 4), float(step), dtype=torch.bfloat16)}
            dcp.save(state, storage_writer=dcp_writer(ckpt, step), no_dist=True)
        (dcp_root(ckpt) / "step-0000000003" / COMMIT).unlink()  # as if killed before commit
        found = dcp_latest(ckpt)
        assert found is not None and found[0] == 2
        target = {"w": torch.zeros((4, 4), dtype=torch.bfloat16)}
        dcp.load(target, storage_reader=found[1], no_dist=True)
    assert torch.equal(target["w"], torch.full((4, 4), 2.0, dtype=torch.bfloat16))
    assert dcp_steps(ckpt) == [1, 2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"w": torch.zeros(1)}, storage_writer=dcp_writer(ckpt, 4), no_dist=True)
    dcp_writer(ckpt, 5)  # retention runs before each new DCP save, keeping 2 committed steps
    assert dcp_steps(ckpt) == [2, 4]
    assert not (dcp_root(ckpt) / "step-0000000001").exists()
    assert (dcp_root(ckpt) / "step-0000000003").exists()  # newer than a kept step: untouched
