"""The persistent tier writes a rank's staging buffer with O_DIRECT where the file system
allows it, and through the page cache elsewhere (tmpfs) or when told to; the bytes are the
same either way (bench/checkpoint.py measures the speed)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer, layout
from hyperpod_agent.checkpoint.env import settings_from_env

from .conftest import assert_same, tmpfs


def _state() -> dict[str, Any]:
    # 5 MiB and a tail of 4100 bytes: an O_DIRECT bulk and a buffered remainder.
    return {"a": np.arange(5 << 18, dtype=np.float32), "tail": b"x" * 4100, "n": 3}


def _opens_with_direct(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the files opened with O_DIRECT from now on."""
    seen: list[str] = []
    real_open = os.open

    def spy(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if flags & os.O_DIRECT:
            seen.append(Path(path).name)
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", spy)
    return seen


def _save_and_restore(persistent: Path, memory: Path, **kw: Any) -> None:
    ckpt = Checkpointer(persistent, memory_dir=memory, **kw)
    try:
        ckpt.save(7, _state()).wait()
    finally:
        ckpt.close()
    fresh = Checkpointer(persistent, memory_dir=memory.with_name("other"), **kw)
    try:
        got = fresh.load_latest()
        assert got is not None and fresh.last_restore is not None
        assert fresh.last_restore.tier == "persistent"
        assert_same(got[1], _state())
    finally:
        fresh.close()


def test_the_staging_buffer_is_written_with_o_direct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = _opens_with_direct(monkeypatch)
    _save_and_restore(tmp_path / "p", tmp_path / "m")
    assert [n.split("-", 2)[:2] for n in direct] == [[".tmp", "rank"]]
    assert direct[0].startswith(".tmp-rank-00000.bin-")
    path = layout.step_dir(tmp_path / "p", 7) / layout.data_name(0)
    assert path.stat().st_size % 4096 != 0, "a tail outside the O_DIRECT bulk"


def test_direct_io_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    direct = _opens_with_direct(monkeypatch)
    _save_and_restore(tmp_path / "p", tmp_path / "m", direct_io=False)
    assert direct == []
    env = {"HYPERPOD_CHECKPOINT_DIR": "/x"}
    assert settings_from_env(env)["direct_io"] is True
    assert settings_from_env({**env, "HYPERPOD_CHECKPOINT_DIRECT_IO": "0"})["direct_io"] is False


def test_a_file_system_without_o_direct_is_written_through_the_page_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # ramfs refuses O_DIRECT (tmpfs accepts it since Linux 6.6).
    with tmpfs(tmp_path / "fs", "64m", "ramfs") as mnt, caplog.at_level(logging.INFO):
        _save_and_restore(mnt / "p", tmp_path / "m")
        assert not list((mnt / "p").rglob(".tmp-*")), "nothing left of the refused attempt"
    assert f"persistent tier {mnt / 'p'}: no O_DIRECT on this file system" in caplog.text
