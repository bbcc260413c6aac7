"""The persistent tier in an object store, through the Checkpointer, against a real S3
server (rclone serve s3): the filesystem tier's guarantees, the run identity, and an
object store behind a filesystem tier."""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hyperpod_agent.checkpoint import (
    Checkpointer,
    CheckpointError,
    CheckpointStorageError,
    layout,
)
from hyperpod_agent.checkpoint import identity as ident
from hyperpod_agent.checkpoint.s3config import MiB, S3Options
from hyperpod_agent.checkpoint.s3store import S3Store

from .conftest import assert_same, sample_state

SMALL = S3Options(part_size=5 * MiB, multipart_threshold=5 * MiB, concurrency=4)


@pytest.fixture
def made() -> Iterator[list[Checkpointer]]:
    """Checkpointers closed at the end of the test."""
    out: list[Checkpointer] = []
    yield out
    for c in out:
        c.close()


@pytest.fixture
def make(made: list[Checkpointer]) -> Callable[..., Checkpointer]:
    def build(persistent: str | Path, **kw: Any) -> Checkpointer:
        kw.setdefault("s3_options", SMALL)
        c = Checkpointer(persistent, **kw)
        made.append(c)
        return c

    return build


def _keys(url: str) -> list[str]:
    with S3Store(url) as store:
        return [o.name for o in store.list_objects()]


def _object(s3_server: Any, url: str, name: str) -> Path:
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    return s3_server.object_path(bucket, f"{prefix}/{name}")


def _big_state(step: int) -> dict[str, Any]:
    """Large enough for multipart uploads and parallel ranged reads (12 MiB)."""
    return {"w": np.full(3 << 20, step, dtype=np.int32), "small": sample_state(step)}


def test_an_s3_url_selects_the_object_store_and_restores_without_fast_tiers(
    s3_url: str, tmp_path: Path, make: Callable[..., Checkpointer]
) -> None:
    ckpt = make(s3_url, memory_dir=tmp_path / "m")
    assert ckpt.persistent_dir is None and ckpt.persistent.location == s3_url
    for step in (1, 2):
        assert ckpt.save(step, _big_state(step)).wait() == {"memory": "ok", "persistent": "ok"}
    assert _keys(s3_url) == [
        "run.json",
        *[
            f"step-000000000{s}/{n}"
            for s in (1, 2)
            for n in ("rank-00000.bin", "rank-00000.json", "step.json")
        ],
    ]
    # The node and its memory are gone: a new process restores from the store alone.
    shutil.rmtree(tmp_path / "m")
    fresh = make(s3_url, memory_dir=tmp_path / "m2")
    got = fresh.load_latest()
    assert got is not None and got[0] == 2
    assert_same(got[1], _big_state(2))
    assert fresh.last_restore is not None
    assert (fresh.last_restore.tier, fresh.last_restore.source) == ("persistent", s3_url)
    assert fresh.run == ckpt.run, "the identity lives in the store"
    with S3Store(s3_url) as store:  # the resumed step is recorded for the controller
        assert json.loads(store.get("resume.json"))["step"] == 2


def test_the_environment_selects_the_object_store(
    s3_url: str, tmp_path: Path, made: list[Checkpointer]
) -> None:
    env = {
        "HYPERPOD_CHECKPOINT_DIR": s3_url,
        "HYPERPOD_CHECKPOINT_MEMORY_DIR": str(tmp_path / "m"),
        "HYPERPOD_CHECKPOINT_KEEP_PERSISTENT": "1",
    }
    ckpt = Checkpointer.from_env(env)
    made.append(ckpt)
    for step in (3, 4):
        ckpt.save(step, sample_state(step)).wait()
    assert sorted({k.split("/")[0] for k in _keys(s3_url)}) == ["run.json", "step-0000000004"]


def _ranks(make: Callable[..., Checkpointer], url: str, tmp_path: Path, **kw: Any) -> list[Any]:
    """Rank 1 starts first and waits for rank 0 to create the run's identity."""
    out: list[Any] = [None, None]

    def start(r: int) -> None:
        try:
            out[r] = make(url, memory_dir=tmp_path / f"m{r}", rank=r, world_size=2, **kw)
        except Exception as exc:  # reported by the assertion below
            out[r] = exc

    t = threading.Thread(target=start, args=(1,))
    t.start()
    start(0)
    t.join(timeout=60)
    assert all(isinstance(c, Checkpointer) for c in out), out
    return out


def test_ranks_agree_on_one_identity_and_a_step_commits_only_when_every_rank_wrote(
    s3_url: str,
    tmp_path: Path,
    make: Callable[..., Checkpointer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "812")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    r0, r1 = _ranks(make, s3_url, tmp_path)
    assert r0.run == r1.run
    handles = [c.save(5, {"w": np.full(8, c.rank)}) for c in (r0, r1)]
    for h in handles:
        h.wait(timeout=60)
    with S3Store(s3_url) as store:
        doc = json.loads(store.get("step-0000000005/step.json"))
    assert doc["run"] == r0.run.run and doc["save"] == f"{r0.attempt}.0"
    # The job is requeued and saves step 5 again; rank 1 dies before it writes anything:
    # its shard of the first launch must not be committed with rank 0's new one.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    again = make(s3_url, memory_dir=tmp_path / "m0", rank=0, world_size=2, commit_timeout=0.5)
    with pytest.raises(CheckpointError, match=r"only ranks \[0\] of 2 .* \(ranks \[1\] hold files"):
        again.save(5, {"w": np.full(8, 100)}).wait(timeout=60)
    assert "step-0000000005/step.json" not in _keys(s3_url)


def test_a_rank_waits_for_rank_0_to_create_the_identity_bounded(
    s3_url: str, tmp_path: Path, make: Callable[..., Checkpointer]
) -> None:
    with pytest.raises(CheckpointStorageError) as e:
        make(s3_url, memory_dir=tmp_path / "m", rank=1, world_size=2, commit_timeout=0.3)
    assert str(e.value) == (
        f"{s3_url}/run.json: rank 0 has not created the run identity within 0.3 s; is rank 0 "
        "running, with the same HYPERPOD_CHECKPOINT_DIR?"
    )
    assert _keys(s3_url) == [], "only rank 0 creates it"


def test_retention_in_the_store(
    s3_url: str, tmp_path: Path, make: Callable[..., Checkpointer]
) -> None:
    ckpt = make(s3_url, memory_dir=tmp_path / "m", keep_persistent=2)
    for step in range(1, 5):
        ckpt.save(step, sample_state(step)).wait()
    steps = sorted({k.split("/")[0] for k in _keys(s3_url) if k.startswith("step-")})
    assert steps == ["step-0000000003", "step-0000000004"]


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_corrupt_or_missing_object_falls_back_to_the_previous_step(
    s3_url: str,
    s3_server: Any,
    tmp_path: Path,
    make: Callable[..., Checkpointer],
    caplog: pytest.LogCaptureFixture,
    damage: str,
) -> None:
    ckpt = make(s3_url, memory_dir=tmp_path / "m")
    for step in (1, 2):
        ckpt.save(step, _big_state(step)).wait()
    shard = "step-0000000002/rank-00000.bin"
    path = _object(s3_server, s3_url, shard)
    if damage == "flip":
        with open(path, "r+b") as f:
            f.seek(9 << 20)  # in a later ranged part of the leaf
            b = f.read(1)
            f.seek(9 << 20)
            f.write(bytes([b[0] ^ 0xFF]))
        why = "checksum mismatch in leaf 'w'"
    else:
        with S3Store(s3_url) as store:  # through the server: it caches its directories
            store.delete([shard])
        why = "no such object"
    shutil.rmtree(tmp_path / "m")
    fresh = make(s3_url, memory_dir=tmp_path / "m2")
    with caplog.at_level(logging.WARNING):
        got = fresh.load_latest()
    assert got is not None and got[0] == 1
    assert_same(got[1], _big_state(1))
    assert f"step 2 rank 0: persistent tier: {s3_url}/{shard}: {why}" in caplog.text


def test_a_replicated_leaf_is_uploaded_once_and_restored_from_its_owner(
    s3_url: str, tmp_path: Path, make: Callable[..., Checkpointer]
) -> None:
    state = {"shared": np.arange(2 << 20, dtype=np.float32), "mine": np.zeros(100)}
    ranks = _ranks(make, s3_url, tmp_path, replicated={"shared"})
    for c in ranks:
        c.save(1, {**state, "mine": np.full(100, float(c.rank))})
    for c in ranks:
        c.wait()
    with S3Store(s3_url) as store:
        sizes = {o.name: o.size for o in store.list_objects("step-0000000001/rank-")}
    assert sorted(sizes.values())[-1] > 8 << 20 > sorted(sizes.values())[-3]  # one holds it
    for r in (0, 1):
        shutil.rmtree(tmp_path / f"m{r}")
    fresh = make(s3_url, memory_dir=tmp_path / "x", rank=1, world_size=2, replicated={"shared"})
    got = fresh.load_latest()
    assert got is not None
    assert_same(got[1], {**state, "mine": np.full(100, 1.0)})


def test_a_filesystem_tier_with_the_store_behind_it_every_m_th_save(
    s3_url: str, tmp_path: Path, make: Callable[..., Checkpointer]
) -> None:
    fs = tmp_path / "fsx" / "run"
    ckpt = make(fs, memory_dir=tmp_path / "m", s3=s3_url, s3_every=2, keep_persistent=5)
    tiers = [ckpt.save(s, sample_state(s)).wait() for s in range(4)]
    assert tiers[0] == {"memory": "ok", "persistent": "ok", "s3": "ok"}
    assert tiers[1] == {"memory": "ok", "persistent": "ok"}
    assert sorted(s for s, i in layout.scan(fs).items() if i.committed) == [0, 1, 2, 3]
    steps = sorted({k.split("/")[0] for k in _keys(s3_url)})
    assert steps == ["run.json", "step-0000000000", "step-0000000002"]
    with S3Store(s3_url) as store:  # the store holds the run's identity too
        assert store.get("run.json") == (fs / ident.RUN_FILE).read_bytes()
    # The scratch file system and the node are lost; the store has step 2.
    shutil.rmtree(fs)
    shutil.rmtree(tmp_path / "m")
    fresh = make(fs, memory_dir=tmp_path / "m2", s3=s3_url)
    assert fresh.run == ckpt.run, "a new directory adopts the store's identity"
    got = fresh.load_latest()
    assert got is not None and got[0] == 2
    assert_same(got[1], sample_state(2))
    assert fresh.last_restore is not None
    assert (fresh.last_restore.tier, fresh.last_restore.source) == ("s3", s3_url)


def test_a_store_holding_another_runs_checkpoints_is_refused(
    s3_url: str, tmp_path: Path, make: Callable[..., Checkpointer]
) -> None:
    first = make(tmp_path / "a", memory_dir=tmp_path / "ma", s3=s3_url)
    first.save(7, sample_state(7)).wait()
    # Another run, whose directory already has its own identity, is pointed at the same
    # prefix: its uploads fail naming the prefix, and it never restores the other's step.
    other = make(tmp_path / "b", memory_dir=tmp_path / "mb")
    other.close()
    second = make(tmp_path / "b", memory_dir=tmp_path / "mb", s3=s3_url)
    with pytest.raises(CheckpointError) as e:
        second.save(1, sample_state(1)).wait()
    assert (
        f"s3 tier failed: {s3_url}/run.json: this store holds the checkpoints of another run "
        f"({first.run.run}), not of this one ({second.run.run}" in str(e.value)
    )
    shutil.rmtree(tmp_path / "b" / "step-0000000001")
    shutil.rmtree(tmp_path / "mb")
    got = second.load_latest()
    assert got is None, "the other run's step 7 is not this run's"


def test_settings_of_the_object_store_tier_are_checked(s3_url: str, tmp_path: Path) -> None:
    from hyperpod_agent.checkpoint import CheckpointConfigError
    from hyperpod_agent.checkpoint.env import settings_from_env

    with pytest.raises(CheckpointConfigError, match=r"^s3=s3://x/y: the object store tier goes"):
        Checkpointer(s3_url, memory_dir=tmp_path / "m", s3="s3://x/y")
    with pytest.raises(CheckpointConfigError, match=r"^s3='/fsx/b': expected s3://bucket/prefix$"):
        Checkpointer(tmp_path / "a", memory_dir=tmp_path / "m", s3="/fsx/b")
    with pytest.raises(CheckpointConfigError, match=r"^s3_every must be at least 1, got 0$"):
        Checkpointer(tmp_path / "a", memory_dir=tmp_path / "m", s3=s3_url, s3_every=0)
    env = {"HYPERPOD_CHECKPOINT_DIR": "/fsx/run", "HYPERPOD_CHECKPOINT_S3": s3_url}
    got = settings_from_env({**env, "HYPERPOD_CHECKPOINT_S3_EVERY": "10"})
    assert (got["s3"], got["s3_every"]) == (s3_url, 10)
    with pytest.raises(CheckpointConfigError, match=r"^HYPERPOD_CHECKPOINT_S3_EVERY='0'"):
        settings_from_env({**env, "HYPERPOD_CHECKPOINT_S3_EVERY": "0"})
