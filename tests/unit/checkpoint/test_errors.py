"""Bad input fails with one precise error and leaves every stored step untouched."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hyperpod_agent.checkpoint import (
    Checkpointer,
    CheckpointError,
    CheckpointStorageError,
    TemplateMismatchError,
    UnsupportedStateError,
    layout,
)

from .conftest import sample_state


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_persistent_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "ckpt"
    f.write_text("keep me")
    with pytest.raises(
        CheckpointStorageError,
        match=r"persistent tier .*ckpt: exists and is not "
        r"a directory",
    ):
        Checkpointer(f, memory_dir=tmp_path / "mem")
    assert f.read_text() == "keep me"


def test_unusable_memory_dir_leaves_the_other_tiers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("x")
    ckpt = Checkpointer(tmp_path / "p", memory_dir=tmp_path / "file" / "mem")
    try:
        assert ckpt.memory_dir is None
        assert re.search(r"no memory tier: memory tier .*file/mem: cannot use", caplog.text)
        assert ckpt.save(1, {"a": np.ones(2)}).wait() == {"persistent": "ok"}
        got = ckpt.load_latest()
        assert got is not None and ckpt.last_restore is not None
        assert ckpt.last_restore.tier == "persistent"
    finally:
        ckpt.close()


class _Opaque:
    pass


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        (
            {"model": {"layers": [np.ones(2), _Opaque()]}},
            r"model/layers/1: values of type "
            r".*_Opaque are not supported",
        ),
        ({"x": np.array([object()])}, r"x: NumPy arrays of dtype object"),
        ({"opt": {(1, 2): 3}}, r"opt/\(1, 2\): dict keys must be str or int, not tuple"),
        ({"s": {1, 2}}, r"s: values of type builtins.set"),
    ],
)
def test_unsupported_values_are_named_and_nothing_is_written(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path], bad: object, where: str
) -> None:
    ckpt = make_ckpt()
    ckpt.save(1, sample_state(1)).wait()
    before = {t: _snapshot(tiers[t]) for t in ("persistent", "mem1")}
    with pytest.raises(UnsupportedStateError, match=where):
        ckpt.save(2, bad)
    ckpt.wait()
    assert {t: _snapshot(tiers[t]) for t in ("persistent", "mem1")} == before


def test_unsupported_torch_layout_is_named(make_ckpt: Callable[..., Checkpointer]) -> None:
    torch = pytest.importorskip("torch")
    ckpt = make_ckpt()
    with pytest.raises(UnsupportedStateError, match=r"emb/weight: torch.sparse_coo tensors"):
        ckpt.save(1, {"emb": {"weight": torch.eye(3).to_sparse()}})


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s["model"].pop("b"), r"model/b: in the checkpoint but not in the template"),
        (lambda s: s["model"].update(extra=np.ones(1)), r"model/extra: missing in the checkpoint"),
        (
            lambda s: s["model"].update(w=np.zeros((8, 16), np.float32)),
            r"model/w: shape \(16, 8\) in the checkpoint, \(8, 16\) in the template",
        ),
        (
            lambda s: s["model"].update(b=np.zeros(8, np.int32)),
            r"model/b: dtype <i8 in the checkpoint, <i4 in the template",
        ),
        (lambda s: s.update(model=[1, 2]), r"model: checkpoint has a dict, template has list"),
    ],
)
def test_mismatched_template_is_a_precise_error(
    make_ckpt: Callable[..., Checkpointer],
    mutate: Callable[[dict[str, object]], object],
    message: str,
) -> None:
    ckpt = make_ckpt()
    ckpt.save(1, sample_state(1)).wait()
    template = sample_state(0)
    mutate(template)
    with pytest.raises(TemplateMismatchError, match=message):
        ckpt.load_latest(template)


def test_matching_template_loads(make_ckpt: Callable[..., Checkpointer]) -> None:
    ckpt = make_ckpt()
    ckpt.save(4, sample_state(4)).wait()
    got = ckpt.load_latest(sample_state(0))
    assert got is not None and got[0] == 4 and got[1]["tag"] == "s4"


def test_torch_template_checks_dtype(make_ckpt: Callable[..., Checkpointer]) -> None:
    torch = pytest.importorskip("torch")
    ckpt = make_ckpt()
    ckpt.save(1, {"w": torch.zeros(2, 2, dtype=torch.bfloat16)}).wait()
    with pytest.raises(
        TemplateMismatchError,
        match=r"w: dtype bfloat16 in the checkpoint, "
        r"float32 in the template",
    ):
        ckpt.load_latest({"w": torch.zeros(2, 2)})
    with pytest.raises(TemplateMismatchError, match=r"w: checkpoint has torch, template has np"):
        ckpt.load_latest({"w": np.zeros((2, 2))})


def test_bad_step_and_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="rank 2 is outside world size 2"):
        Checkpointer(tmp_path / "p", memory_dir=tmp_path / "m", rank=2, world_size=2)
    with pytest.raises(CheckpointError, match="keep_memory must be at least 1"):
        Checkpointer(tmp_path / "p", memory_dir=tmp_path / "m", keep_memory=0)
    ckpt = Checkpointer(tmp_path / "p", memory_dir=tmp_path / "m")
    try:
        with pytest.raises(CheckpointError, match="step must be an int"):
            ckpt.save(-1, {})
    finally:
        ckpt.close()


def test_world_size_change_is_reported(
    tiers: dict[str, Path], make_ckpt: Callable[..., Checkpointer]
) -> None:
    make_ckpt().save(1, {"a": np.ones(2)}).wait()
    # Same files, read as a 2-rank job: rank 0's shard says world size 1.
    two = make_ckpt(rank=0, world_size=2, memory_dir=tiers["mem2"])
    assert layout.scan(tiers["persistent"])[1].committed
    with pytest.raises(CheckpointError, match="saved by 1 ranks, this job has 2"):
        two.load_latest()


def test_a_failing_tier_is_reported_and_the_others_still_written(
    make_ckpt: Callable[..., Checkpointer], tiers: dict[str, Path]
) -> None:
    ckpt = make_ckpt()
    # The memory tier's step directory name is taken by a file: that tier fails, persistent not.
    assert ckpt.memory_dir is not None
    (ckpt.memory_dir / "step-0000000003").write_text("in the way")
    with pytest.raises(CheckpointError, match=r"step 3: memory tier failed"):
        ckpt.save(3, {"a": np.ones(2)}).wait()
    assert layout.scan(tiers["persistent"])[3].committed
