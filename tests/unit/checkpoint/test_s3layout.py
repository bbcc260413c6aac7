"""Commit, discovery and retention of steps in the object store, against the real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.checkpoint import layout, s3layout
from hyperpod_agent.checkpoint.s3config import S3Options
from hyperpod_agent.checkpoint.s3errors import S3ThrottledError
from hyperpod_agent.checkpoint.s3store import S3Store
from tests.s3_proxy import FaultProxy

from .conftest import use_aws_env


def _write_shards(store: S3Store, step: int, ranks: range) -> None:
    for r in ranks:
        store.put(s3layout.step_prefix(step) + layout.data_name(r), bytes([r]) * 10)
        store.put(s3layout.step_prefix(step) + layout.meta_name(r), b"{}")


def _save(store: S3Store, step: int, world: int = 2) -> None:
    _write_shards(store, step, range(world))
    assert s3layout.scan(store)[step].complete(world)
    s3layout.commit(store, step, {"format": layout.FORMAT, "step": step, "world_size": world})


def test_a_step_is_visible_only_once_its_manifest_is_written(s3_url: str) -> None:
    with S3Store(s3_url) as store:
        assert s3layout.latest_committed(store) is None
        _write_shards(store, 5, range(2))
        info = s3layout.scan(store)[5]
        assert info.ranks == {0, 1} and not info.committed
        assert s3layout.latest_committed(store) is None
        s3layout.commit(store, 5, {"step": 5})
        assert s3layout.latest_committed(store) == 5
        assert store.get("step-0000000005/step.json") == b'{"step":5}'


def test_a_half_written_newer_step_is_ignored_and_kept_while_it_may_be_in_flight(
    s3_url: str,
) -> None:
    with S3Store(s3_url) as store:
        _save(store, 1)
        _save(store, 2)
        _write_shards(store, 3, range(1))  # killed after rank 0's shard
        assert s3layout.latest_committed(store) == 2
        assert s3layout.prune(store, keep=1) == [1]
        assert sorted(s3layout.scan(store)) == [2, 3]


def test_retention_keeps_the_newest_and_removes_older_half_written_steps(s3_url: str) -> None:
    with S3Store(s3_url) as store:
        _save(store, 10)
        _write_shards(store, 15, range(1))  # a killed job's leftover
        _save(store, 20)
        _save(store, 30)
        _save(store, 40)
        assert s3layout.prune(store, keep=2) == [10, 15, 20]
        assert sorted(s3layout.scan(store)) == [30, 40]
        assert [o.name for o in store.list_objects()] == [
            f"step-00000000{s}/{n}"
            for s in (30, 40)
            for n in (
                "rank-00000.bin",
                "rank-00000.json",
                "rank-00001.bin",
                "rank-00001.json",
                "step.json",
            )
        ]
        assert s3layout.prune(store, keep=2) == []


def test_a_step_half_deleted_is_not_complete(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, s3_url: str
) -> None:
    # Retention cut off after deleting the manifest (the store refuses the next batch
    # delete): the shards left behind never make the step look complete again, and the
    # manifest went first, alone (the shards are all still there).
    with FaultProxy(s3_server.port) as proxy:
        use_aws_env(monkeypatch, tmp_path, s3_server.env(proxy.url))
        with S3Store(s3_url, S3Options(max_attempts=1)) as store:
            _save(store, 1)
            _save(store, 2)
            proxy.inject("slowdown", 1, methods=("POST",))  # the manifest's DeleteObjects
            with pytest.raises(S3ThrottledError):
                s3layout.prune(store, keep=1)
            assert s3layout.scan(store)[1].committed  # nothing was deleted yet
            # Now the manifest's delete goes through and the shards' delete is refused.
            proxy.inject("slowdown", 1, methods=("POST",), skip=1)
            with pytest.raises(S3ThrottledError):
                s3layout.prune(store, keep=1)
            info = s3layout.scan(store)[1]
            assert not info.committed and info.ranks == {0, 1}
            assert s3layout.latest_committed(store) == 2
            # The leftover goes with the next retention that removes older steps.
            _save(store, 3)
            assert s3layout.prune(store, keep=1) == [1, 2]
            assert sorted(s3layout.scan(store)) == [3]
