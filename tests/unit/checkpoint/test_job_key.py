"""A job id Slurm hands out again never restores (or overwrites) the old job's checkpoints.

With the SPANK plugin's ``checkpoint_root``, a job's persistent directory is
``<root>/<job id>``. The plugin gives every submission a random job key (it survives a
requeue); the library records it in the run identity and refuses a directory made for
another key, while a requeue of the same job (same key) restores as before.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hyperpod_agent.checkpoint import CheckpointConfigError, Checkpointer
from hyperpod_agent.checkpoint import identity as ident
from hyperpod_agent.checkpoint.env import settings_from_env

from .conftest import assert_same

KEY_A = "3f1c9b7e2a6d4c0b8e5f1a2b3c4d5e6f"
KEY_B = "aa1c9b7e2a6d4c0b8e5f1a2b3c4d5e60"


def _files(*roots: Path) -> dict[str, bytes]:
    """Every file's bytes under ``roots`` (what must stay untouched)."""
    return {
        str(p): p.read_bytes() for root in roots for p in sorted(root.rglob("*")) if p.is_file()
    }


def _old_job(persistent: Path, memory: Path, key: str | None) -> None:
    ckpt = Checkpointer(persistent, memory_dir=memory, job_key=key)
    try:
        ckpt.save(300, {"w": np.full(10, 300.0)}).wait()
    finally:
        ckpt.close()


def test_the_job_key_is_recorded_and_a_requeue_with_it_restores(tmp_path: Path) -> None:
    persistent, memory = tmp_path / "ckpt" / "17", tmp_path / "shm" / "17"
    _old_job(persistent, memory, KEY_A)
    assert json.loads((persistent / ident.RUN_FILE).read_bytes())["job_key"] == KEY_A
    requeued = Checkpointer(persistent, memory_dir=memory, job_key=KEY_A)
    try:
        got = requeued.load_latest()
        assert got is not None and got[0] == 300
        assert requeued.last_restore is not None and requeued.last_restore.tier == "memory"
        assert_same(got[1], {"w": np.full(10, 300.0)})
    finally:
        requeued.close()


@pytest.mark.parametrize("old_key", [KEY_A, None], ids=["other-key", "no-key"])
def test_a_reused_job_id_is_refused_and_nothing_is_touched(
    tmp_path: Path, old_key: str | None
) -> None:
    # Slurm's state was reset: job 17 runs again; the old job 17's checkpoints are still
    # in <root>/17 and its memory tier is still on the node.
    persistent, memory = tmp_path / "ckpt" / "17", tmp_path / "shm" / "17"
    _old_job(persistent, memory, old_key)
    before = _files(persistent, memory)
    with pytest.raises(ident.OtherJobError) as e:
        Checkpointer(persistent, memory_dir=memory, job_key=KEY_B)
    text = str(e.value)
    assert "\n" not in text
    theirs = f"job key {old_key}" if old_key else "no job key"
    assert text == (
        f"{persistent / ident.RUN_FILE}: these checkpoints belong to another job ({theirs}), "
        f"not to this one (job key {KEY_B}): a job id handed out again? Nothing was restored "
        "or overwritten; move the directory away, or give this job its own "
        "HYPERPOD_CHECKPOINT_DIR"
    )
    assert _files(persistent, memory) == before


def test_without_a_job_key_nothing_is_checked(tmp_path: Path) -> None:
    # An explicit HYPERPOD_CHECKPOINT_DIR shared by a chain of jobs: the plugin sets no key.
    persistent, memory = tmp_path / "mine", tmp_path / "shm" / "1"
    _old_job(persistent, memory, KEY_A)
    ckpt = Checkpointer(persistent, memory_dir=memory)
    try:
        got = ckpt.load_latest()
        assert got is not None and got[0] == 300
    finally:
        ckpt.close()


def test_the_job_key_comes_from_the_environment() -> None:
    base = {"HYPERPOD_CHECKPOINT_DIR": "/x"}
    assert settings_from_env(base)["job_key"] is None
    got = settings_from_env({**base, "HYPERPOD_CHECKPOINT_JOB_KEY": KEY_A})
    assert got["job_key"] == KEY_A
    for bad in ("short", "x" * 129, "has space 0123456789", "naïve0123456789"):
        with pytest.raises(CheckpointConfigError) as e:
            settings_from_env({**base, "HYPERPOD_CHECKPOINT_JOB_KEY": bad})
        assert str(e.value).startswith("HYPERPOD_CHECKPOINT_JOB_KEY=")
