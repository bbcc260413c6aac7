"""Round trips through every tier are bit-exact and keep dtype, shape and container types."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer

from .conftest import assert_same, sample_state


def _roundtrip(make_ckpt: Callable[..., Checkpointer], state: Any) -> Any:
    ckpt = make_ckpt()
    ckpt.save(7, state).wait()
    got = ckpt.load_latest()
    assert got is not None and got[0] == 7
    return got[1]


def test_nested_numpy_state_round_trips(make_ckpt: Callable[..., Checkpointer]) -> None:
    state = sample_state(3)
    assert_same(state, _roundtrip(make_ckpt, state))


def test_edge_arrays_round_trip(make_ckpt: Callable[..., Checkpointer]) -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    state = {
        "zero_d": np.array(3.5, dtype=np.float16),
        "empty": np.zeros((0, 3), dtype=np.int32),
        "noncontig": base[:, ::2].T,
        "reversed": base[::-1],
        "big_endian": np.arange(5, dtype=">i4"),
        "bools": np.array([True, False]),
        "complex": np.array([1 + 2j], dtype=np.complex64),
        "strings": np.array(["ab", "c"]),
        "structured": np.zeros(2, dtype=[("x", "<i4"), ("y", "<f8")]),
        "np_scalar": np.float32(1.25),
        "nan": float("nan"),
        "big_int": 2**70,
        "tuple": (1, None, True, "x"),
        "empty_bytes": b"",
        "mutable": bytearray(b"abc"),
        "list_of_arrays": [np.ones(3, dtype=np.uint8), np.zeros(1, dtype=np.int8)],
    }
    got = _roundtrip(make_ckpt, state)
    state["noncontig"] = np.ascontiguousarray(state["noncontig"])
    state["reversed"] = np.ascontiguousarray(state["reversed"])
    assert_same(state, got)


def test_torch_tensors_round_trip(make_ckpt: Callable[..., Checkpointer]) -> None:
    torch = pytest.importorskip("torch")
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {
        "bf16": torch.randn(5, 3).to(torch.bfloat16),
        "f16": torch.randn(4, dtype=torch.float16),
        "zero_d": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 4, dtype=torch.bfloat16),
        "noncontig": base.t()[1:, ::2],
        "grad": torch.ones(3, requires_grad=True),
        "int8": torch.tensor([-1, 2], dtype=torch.int8),
        "bool": torch.tensor([True, False]),
        "c64": torch.tensor([1 + 1j], dtype=torch.complex64),
        "i64": torch.tensor([2**62], dtype=torch.int64),
        "mixed": {"np": np.arange(3), "opt_state": {0: {"step": torch.tensor(10.0)}}},
    }
    got = _roundtrip(make_ckpt, state)
    expected = dict(state)
    expected["noncontig"] = state["noncontig"].contiguous()
    expected["grad"] = state["grad"].detach()
    assert_same(expected, got)
    assert got["noncontig"].shape == (5, 2)
    assert got["bf16"].dtype == torch.bfloat16


def test_mutation_after_save_returns_does_not_leak_into_the_checkpoint(
    make_ckpt: Callable[..., Checkpointer],
) -> None:
    ckpt = make_ckpt()
    arr = np.arange(1000, dtype=np.float32)
    h = ckpt.save(1, {"a": arr})
    arr[:] = -1  # training continues while the background writes run
    h.wait()
    got = ckpt.load_latest()
    assert got is not None and got[0] == 1
    assert np.array_equal(got[1]["a"], np.arange(1000, dtype=np.float32))


def test_save_returns_before_durable_and_handle_reports_tiers(
    make_ckpt: Callable[..., Checkpointer],
) -> None:
    ckpt = make_ckpt()
    h = ckpt.save(1, sample_state(1))
    assert h.wait(timeout=30) == {"memory": "ok", "persistent": "ok"}
    assert h.done()
    assert set(h.seconds) == {"memory", "persistent"}
    assert all(0 < v < 30 for v in h.seconds.values())
    ckpt.wait()
