"""What a user meets when the object store fails, through the Checkpointer: one line naming
the bucket and key; a save that cannot reach the store fails its handle without blocking
training and without losing the memory and peer tiers; restores fall back across sources.

Against real peers: rclone's S3 server (stopped, with wrong keys, without the bucket) and
the fault proxy in front of it (503 SlowDown, silence), and a saver killed with SIGKILL
in the middle of an upload.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer, CheckpointError, ReplicaServer, _threads
from hyperpod_agent.checkpoint.s3config import MiB, S3Options
from hyperpod_agent.checkpoint.s3errors import S3AuthError, S3BucketError, S3UnreachableError
from hyperpod_agent.checkpoint.s3store import S3Store
from tests.s3_proxy import FaultProxy
from tests.s3_server import S3Server

from . import _saver
from .conftest import assert_same, free_port, use_aws_env

FAST = S3Options(max_attempts=2, connect_timeout=2, read_timeout=30)
SMALL_PARTS = S3Options(part_size=5 * MiB, multipart_threshold=5 * MiB, concurrency=4)


def _state(step: int) -> dict[str, Any]:
    return {"w": np.full(1000, step, dtype=np.float64), "step": step}


def _wait_for(cond: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.01)


@pytest.fixture
def proxy(s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's server; the AWS variables point at it."""
    with FaultProxy(s3_server.port, timeout=60) as p:
        use_aws_env(monkeypatch, tmp_path, s3_server.env(p.url))
        yield p


def _url(request: pytest.FixtureRequest) -> str:
    return f"s3://ckpt/{request.node.name.replace('[', '-').replace(']', '')}"


# ---- wrong settings: the run does not start, with one line ------------------------------


def test_wrong_secret_key_stops_the_run_at_start(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_aws_env(monkeypatch, tmp_path, {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "x" * 40})
    with pytest.raises(S3AuthError) as e:
        Checkpointer("s3://ckpt/run1", memory_dir=tmp_path / "m", s3_options=FAST)
    assert str(e.value) == (
        "s3://ckpt/run1/run.json: access denied (SignatureDoesNotMatch): the secret key does "
        f"not match access key {s3_server.access_key}; check AWS_SECRET_ACCESS_KEY or the "
        "profile's aws_secret_access_key"
    )


def test_a_missing_bucket_stops_the_run_at_start(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_aws_env(monkeypatch, tmp_path, s3_server.env())
    with pytest.raises(S3BucketError) as e:
        Checkpointer("s3://no-such-bucket/run1", memory_dir=tmp_path / "m", s3_options=FAST)
    assert str(e.value) == (
        f"s3://no-such-bucket/run1/run.json: no bucket 'no-such-bucket' at {s3_server.url}; "
        "create it first"
    )


def test_an_endpoint_that_is_down_stops_the_run_at_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    env = {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "AKIA" + "A" * 16,
        "AWS_SECRET_ACCESS_KEY": "s" * 40,
        "AWS_REGION": "us-east-1",
    }
    use_aws_env(monkeypatch, tmp_path, env)
    with pytest.raises(S3UnreachableError) as e:
        Checkpointer("s3://ckpt/run1", memory_dir=tmp_path / "m", s3_options=FAST)
    assert str(e.value) == f"s3://ckpt/run1/run.json: cannot connect to {url}: connection refused"


def test_wrong_keys_for_the_store_behind_a_filesystem_tier_fail_that_tier_only(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fs = tmp_path / "fsx"
    Checkpointer(fs, memory_dir=tmp_path / "m").close()  # the run exists on the file system
    use_aws_env(monkeypatch, tmp_path, {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "x" * 40})
    ckpt = Checkpointer(fs, memory_dir=tmp_path / "m", s3="s3://ckpt/behind", s3_options=FAST)
    try:
        with pytest.raises(CheckpointError) as e:
            ckpt.save(1, _state(1)).wait()
        assert str(e.value).startswith(
            "step 1: s3 tier failed: s3://ckpt/behind/run.json: access denied "
            "(SignatureDoesNotMatch)"
        )
        got = ckpt.load_latest()  # the filesystem tier and the memory tier have it
        assert got is not None and got[0] == 1
    finally:
        ckpt.close()


# ---- the store fails during the run -----------------------------------------------------


def test_a_store_that_goes_down_fails_the_save_and_the_fast_tiers_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    srv = S3Server(tmp_path / "s3").start()
    use_aws_env(monkeypatch, tmp_path, srv.env())
    port = free_port()
    ckpt = Checkpointer(
        "s3://ckpt/run",
        memory_dir=tmp_path / "a",
        node="a",
        peers={"a": ("127.0.0.1", 1), "b": ("127.0.0.1", port)},
        s3_options=FAST,
    )
    server = ReplicaServer(tmp_path / "b", "127.0.0.1", port, secret=ckpt.secret).start()
    try:
        assert ckpt.save(1, _state(1)).wait() == {"peer": "ok", "persistent": "ok", "memory": "ok"}
        srv.stop()
        with pytest.raises(CheckpointError) as e:
            ckpt.save(2, _state(2)).wait(timeout=60)
        assert str(e.value) == (
            "step 2: persistent tier failed: s3://ckpt/run/step-0000000002/step.json: cannot "
            f"connect to {srv.url}: connection refused"
        )
        shutil.rmtree(tmp_path / "a")  # the node's memory is lost too: the peer has step 2
        with caplog.at_level(logging.WARNING):
            got = ckpt.load_latest()
        assert got is not None and got[0] == 2
        assert_same(got[1], _state(2))
        assert ckpt.last_restore is not None and ckpt.last_restore.tier == "peer"
        assert (
            "rank 0: persistent tier not consulted: s3://ckpt/run/: cannot connect to "
            f"{srv.url}: connection refused" in caplog.text
        )
    finally:
        ckpt.close()
        server.stop()
        srv.stop()


def test_throttling_is_retried_and_when_it_persists_the_save_fails_naming_the_key(
    proxy: FaultProxy, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(request)
    ckpt = Checkpointer(url, memory_dir=tmp_path / "m", s3_options=S3Options(max_attempts=3))
    try:
        proxy.inject("slowdown", 2, methods=("PUT",))
        assert ckpt.save(1, _state(1)).wait() == {"persistent": "ok", "memory": "ok"}
        assert proxy.served["slowdown"] == 2
        proxy.inject("slowdown", 1000, methods=("PUT",))
        with pytest.raises(CheckpointError) as e:
            ckpt.save(2, _state(2)).wait(timeout=60)
        assert str(e.value) == (
            f"step 2: persistent tier failed: {url}/step-0000000002/rank-00000.bin: throttled "
            f"by {proxy.url} (SlowDown) after 3 attempts; the store is overloaded: retry "
            "later, or lower the request rate (concurrency)"
        )
        proxy.clear()
        got = ckpt.load_latest()
        assert got is not None and got[0] == 2 and ckpt.last_restore is not None
        assert ckpt.last_restore.tier == "memory"
    finally:
        ckpt.close()


def test_a_store_that_hangs_never_blocks_training(
    proxy: FaultProxy, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(request)
    ckpt = Checkpointer(url, memory_dir=tmp_path / "m", s3_options=FAST)
    try:
        proxy.inject("stall", 1000)  # every request from now on: no answer
        handle = ckpt.save(1, _state(1))  # returns once the state is staged
        _wait_for(lambda: proxy.served["stall"] >= 1, "the upload reaches the store")
        assert not handle.done(), "the upload hangs; the training loop has its state back"
        # The next save does not wait for the hung upload: its memory tier is written and
        # its own upload skipped (one upload in flight), while step 1 still hangs.
        nxt = ckpt.save(2, _state(2))
        assert nxt.wait(timeout=30) == {
            "memory": "ok",
            "persistent": "skipped: the upload of step 1 is still running",
        }
        assert not handle.done()
        proxy.stop()  # the endpoint goes away: the hung request is cut, the retry refused
        with pytest.raises(CheckpointError) as e:
            handle.wait(timeout=60)
        assert str(e.value).startswith(
            f"step 1: persistent tier failed: {url}/step-0000000001/step.json: "
        )
        got = ckpt.load_latest()  # the store is gone: the memory tier has step 2
        assert got is not None and got[0] == 2
    finally:
        proxy.stop()  # a failed assertion must not leave close() waiting for the upload
        ckpt.close()


def test_an_upload_in_flight_keeps_its_staging_memory(
    proxy: FaultProxy, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # With one step kept in memory, the next save retires the uploading step's buffer: the
    # one after must not stage into it while its parts are still being sent.
    url = _url(request)
    ckpt = Checkpointer(url, memory_dir=tmp_path / "m", keep_memory=1, s3_options=SMALL_PARTS)
    big = [{"w": np.full(3 << 20, s, dtype=np.int32)} for s in range(4)]
    try:
        proxy.inject("hold", 1, methods=("PUT",), skip=1)  # the second part of step 1 waits
        first = ckpt.save(1, big[1])
        _wait_for(lambda: proxy.served["hold"] == 1, "a part is held")
        for s in (2, 3):
            assert ckpt.save(s, big[s]).wait(timeout=30)["persistent"].startswith("skipped")
        proxy.release()
        assert first.wait(timeout=60) == {"memory": "ok", "persistent": "ok"}
        shutil.rmtree(tmp_path / "m")
        got = ckpt.load_latest()  # from the store: step 1, as it was staged
        assert got is not None and got[0] == 1
        assert_same(got[1], big[1])
    finally:
        proxy.release()
        ckpt.close()


def test_a_step_a_rank_skipped_is_given_up_at_once(
    s3_server: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    # Ranks skip an upload on their own, when their previous one still runs, so they may
    # skip different steps. Rank 0 must not wait out commit_timeout for a rank that moved
    # on (its metadata of a later save is there): it gives the step up and says which.
    url = _url(request)
    monkeypatch.setenv("SLURM_JOB_ID", "813")
    use_aws_env(monkeypatch, tmp_path, s3_server.env())
    common: dict[str, Any] = {"world_size": 2, "commit_timeout": 90, "s3_options": FAST}
    r0 = Checkpointer(url, memory_dir=tmp_path / "m0", rank=0, **common)
    with FaultProxy(s3_server.port, timeout=60) as slow:  # rank 1's store is slow
        monkeypatch.setenv("AWS_ENDPOINT_URL", slow.url)
        r1 = Checkpointer(url, memory_dir=tmp_path / "m1", rank=1, **common)
        try:
            slow.inject("hold", 1, methods=("PUT",))
            r1_4 = r1.save(4, _state(4))
            _wait_for(lambda: slow.served["hold"] == 1, "rank 1's upload of step 4 is held")
            assert r1.save(5, _state(5)).wait(timeout=30)["persistent"] == (
                "skipped: the upload of step 4 is still running"
            )
            r0_4 = r0.save(4, _state(4))
            slow.release()
            for h in (r0_4, r1_4):
                assert h.wait(timeout=60)["persistent"] == "ok"
            assert r1.save(6, _state(6)).wait(timeout=60)["persistent"] == "ok"
            with pytest.raises(CheckpointError) as e:  # waiting out commit_timeout: TimeoutError
                r0.save(5, _state(5)).wait(timeout=30)
            assert str(e.value) == (
                "step 5: persistent tier failed: step 5: ranks [1] moved on to a newer step "
                "without writing this one: not committed"
            )
        finally:
            slow.release()
            r1.close()
            r0.close()


@pytest.mark.parametrize(("behind", "nice"), [(False, _threads.DISK), (True, _threads.NETWORK)])
def test_uploads_run_at_the_background_priority(
    proxy: FaultProxy, tmp_path: Path, request: pytest.FixtureRequest, behind: bool, nice: int
) -> None:
    url = _url(request)
    kw: dict[str, Any] = {"s3": url} if behind else {}
    where: str | Path = tmp_path / "fs" if behind else url
    ckpt = Checkpointer(where, memory_dir=tmp_path / "m", s3_options=SMALL_PARTS, **kw)
    try:
        proxy.inject("stall", 1000, methods=("PUT",), skip=1)  # parts hang after the first
        handle = ckpt.save(1, {"w": np.ones(12 * MiB, dtype=np.uint8)})
        _wait_for(lambda: proxy.served["stall"] >= 1, "a part upload hangs")
        senders = [t for t in threading.enumerate() if t.name.startswith("hyperpod-s3")]
        assert senders, "the parts are sent by their own threads"
        # A pool thread just started may not have its native id yet: wait, bounded.
        _wait_for(lambda: all(t.native_id is not None for t in senders), "senders running")
        for t in senders:
            assert t.native_id is not None
            stat = Path(f"/proc/self/task/{t.native_id}/stat").read_text()
            assert int(stat.rsplit(")", 1)[1].split()[16]) == nice, t.name
        proxy.stop()
        with pytest.raises(CheckpointError):
            handle.wait(timeout=60)
    finally:
        proxy.stop()  # a failed assertion must not leave close() waiting for the upload
        ckpt.close()


# ---- a saver killed in the middle of an upload --------------------------------------------


@pytest.mark.parametrize(
    ("skip", "left"),
    [(2, "mid-multipart"), (5, "data uploaded, metadata not")],
    ids=["mid-multipart", "before-metadata"],
)
def test_a_save_killed_mid_upload_never_yields_a_torn_step(
    proxy: FaultProxy,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
    skip: int,
    left: str,
) -> None:
    url = _url(request)
    memory = tmp_path / "m"

    def stop_mid_upload() -> None:
        # Step 1 hangs after `skip` PUTs of its upload: then kill -9.
        proxy.inject("stall", 1, methods=("PUT",), skip=skip)
        _wait_for(lambda: proxy.served["stall"] == 1, f"the saver stops {left}")

    # 24 MiB state, 5 MiB parts: the data object is 5 part PUTs, then the metadata PUT.
    durable = _saver.run_and_kill(url, memory, 0, stop_mid_upload, part_mib=5)
    assert durable == [0]
    torn = max(durable) + 1  # the step being uploaded when the saver died
    proxy.clear()
    shutil.rmtree(memory)  # restore from the store alone
    reader = Checkpointer(url, memory_dir=tmp_path / "r", s3_options=FAST)
    try:
        with caplog.at_level(logging.INFO):
            got = reader.load_latest()
        assert got is not None and got[0] == max(durable), "the last durable step"
        assert_same(got[1], _saver.state_for(got[0]))
        with S3Store(url) as store:
            names = {o.name for o in store.list_objects(f"step-{torn:010d}/")}
        if left == "mid-multipart":
            assert names == set(), "an unfinished multipart upload is invisible"
        else:
            assert names == {f"step-{torn:010d}/rank-00000.bin"}
            assert (
                f"{url}/step-{torn:010d}/: not committed (no step.json): a save killed "
                "half-way, or still in flight; not restored" in caplog.text
            )
        # The next save of that step by the restarted job commits it whole.
        reader.save(torn, _saver.state_for(torn)).wait()
        again = Checkpointer(url, memory_dir=tmp_path / "r2", s3_options=FAST)
        try:
            got = again.load_latest()
            assert got is not None and got[0] == torn
            assert_same(got[1], _saver.state_for(torn))
        finally:
            again.close()
    finally:
        reader.close()
