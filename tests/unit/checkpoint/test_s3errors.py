"""Every failure a user meets on the S3 tier is one line naming the bucket and key.

Against real peers: rclone's S3 server with wrong keys or a missing bucket, a server that
was stopped, and a loopback proxy in front of it that answers 503 SlowDown, cuts bodies
short or never answers (tests/s3_proxy.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hyperpod_agent.checkpoint.s3config import MiB, S3Options
from hyperpod_agent.checkpoint.s3errors import (
    S3AuthError,
    S3BucketError,
    S3Error,
    S3ThrottledError,
    S3TruncatedError,
    S3UnreachableError,
)
from hyperpod_agent.checkpoint.s3store import S3Store
from tests.s3_proxy import FaultProxy
from tests.s3_server import S3Server

from .conftest import use_aws_env

FAST = S3Options(max_attempts=3, connect_timeout=2, read_timeout=2)


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


@pytest.fixture
def proxy(s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's server; the AWS variables point at it."""
    with FaultProxy(s3_server.port) as p:
        use_aws_env(monkeypatch, tmp_path, s3_server.env(p.url))
        yield p


def test_wrong_secret_key(s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_aws_env(monkeypatch, tmp_path, {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "x" * 40})
    with S3Store("s3://ckpt/run1", FAST) as store, pytest.raises(S3AuthError) as e:
        store.put("step-0000000001/rank-00000.bin", b"data")
    assert _one_line(e.value) == (
        "s3://ckpt/run1/step-0000000001/rank-00000.bin: access denied (SignatureDoesNotMatch): "
        f"the secret key does not match access key {s3_server.access_key}; check "
        "AWS_SECRET_ACCESS_KEY or the profile's aws_secret_access_key"
    )


def test_unknown_access_key(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {**s3_server.env(), "AWS_ACCESS_KEY_ID": "AKIAUNKNOWNUNKNOWN00"}
    use_aws_env(monkeypatch, tmp_path, env)
    with S3Store("s3://ckpt/run1", FAST) as store, pytest.raises(S3AuthError) as e:
        store.get("step-0000000001/step.json")
    assert _one_line(e.value) == (
        "s3://ckpt/run1/step-0000000001/step.json: access denied (InvalidAccessKeyId): access "
        f"key AKIAUNKNOWNUNKNOWN00 is unknown to {s3_server.url}; check AWS_ACCESS_KEY_ID or "
        "the profile's aws_access_key_id"
    )


def test_no_credentials_at_all(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_aws_env(monkeypatch, tmp_path, {"AWS_ENDPOINT_URL": s3_server.url})
    with S3Store("s3://ckpt/run1", FAST) as store, pytest.raises(S3AuthError) as e:
        store.size("x")
    assert _one_line(e.value) == (
        "s3://ckpt/run1/x: no credentials found: set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with ~/.aws/credentials"
    )


def test_missing_bucket(s3_url: str, s3_server: Any) -> None:
    with S3Store("s3://no-such-bucket/run1", FAST) as store:
        for op in (lambda: store.put("a.bin", b"x"), lambda: store.get("a.bin")):
            with pytest.raises(S3BucketError) as e:
                op()
            assert _one_line(e.value) == (
                f"s3://no-such-bucket/run1/a.bin: no bucket 'no-such-bucket' at "
                f"{s3_server.url}; create it first"
            )
        with pytest.raises(S3BucketError, match=r"^s3://no-such-bucket/run1/: no bucket"):
            list(store.list_objects())


def test_server_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = S3Server(tmp_path / "s3").start()
    use_aws_env(monkeypatch, tmp_path, srv.env())
    with S3Store("s3://ckpt/run1", FAST) as store:
        store.put("a.bin", b"x")
        srv.stop()
        with pytest.raises(S3UnreachableError) as e:
            store.put("a.bin", b"y")
    assert _one_line(e.value) == (
        f"s3://ckpt/run1/a.bin: cannot connect to {srv.url}: connection refused"
    )


def test_slowdown_is_retried_with_backoff(s3_url: str, proxy: FaultProxy) -> None:
    with S3Store(s3_url, FAST) as store:
        proxy.inject("slowdown", 2)
        store.put("a.bin", b"x")  # third attempt goes through
        assert proxy.served["slowdown"] == 2
        proxy.inject("slowdown", 2, methods=("GET",))
        assert store.get("a.bin") == b"x"
        assert proxy.served["slowdown"] == 4


def test_slowdown_that_persists_gives_up_after_the_bounded_attempts(
    s3_url: str, proxy: FaultProxy
) -> None:
    proxy.inject("slowdown", 100)
    with S3Store(s3_url, FAST) as store, pytest.raises(S3ThrottledError) as e:
        store.put("step-0000000002/rank-00001.bin", b"x")
    assert proxy.served["slowdown"] == FAST.max_attempts
    assert _one_line(e.value) == (
        f"{s3_url}/step-0000000002/rank-00001.bin: throttled by {proxy.url} (SlowDown) after "
        "3 attempts; the store is overloaded: retry later, or lower the request rate "
        "(concurrency)"
    )


def test_truncated_answer_is_read_again(s3_url: str, proxy: FaultProxy) -> None:
    data = np.random.default_rng(1).integers(0, 256, 12 * MiB, dtype=np.uint8)
    opts = S3Options(part_size=5 * MiB, max_attempts=3)
    with S3Store(s3_url, opts) as store:
        store.put("a.bin", data)
        proxy.inject("truncate", 1, methods=("GET",), keep=1000)
        out = np.zeros_like(data)
        store.read_into("a.bin", out, size=data.size)
        assert proxy.served["truncate"] == 1
        assert out.tobytes() == data.tobytes()
        proxy.inject("truncate", 1, methods=("GET",), keep=10)
        assert store.get("a.bin") == data.tobytes()


def test_answers_always_cut_short_give_a_truncation_error(s3_url: str, proxy: FaultProxy) -> None:
    with S3Store(s3_url, FAST) as store:
        store.put("a.bin", b"0123456789" * 1000)
        proxy.inject("truncate", 100, methods=("GET",), keep=100)
        with pytest.raises(S3TruncatedError) as e:
            store.read_into("a.bin", np.empty(10_000, dtype=np.uint8))
        assert proxy.served["truncate"] == 3
        assert _one_line(e.value).startswith(f"{s3_url}/a.bin: answer cut short: ")
        assert _one_line(e.value).endswith("(after 3 attempts)")
        with pytest.raises(S3TruncatedError, match=rf"^{s3_url}/a\.bin: answer cut short: "):
            store.get("a.bin")


def test_a_store_that_never_answers_times_out(s3_url: str, proxy: FaultProxy) -> None:
    proxy.inject("stall", 100)
    opts = S3Options(max_attempts=2, connect_timeout=1, read_timeout=1)
    with S3Store(s3_url, opts) as store, pytest.raises(S3UnreachableError) as e:
        store.size("a.bin")
    assert _one_line(e.value).startswith(f"{s3_url}/a.bin: no answer from {proxy.url} in time")
    assert proxy.served["stall"] == 2


def test_failed_multipart_upload_leaves_old_object_and_no_parts(
    s3_url: str, proxy: FaultProxy
) -> None:
    opts = S3Options(part_size=5 * MiB, multipart_threshold=5 * MiB, max_attempts=2)
    with S3Store(s3_url, opts) as store:
        store.put("a.bin", b"old")
        proxy.inject("slowdown", 100, methods=("PUT",))  # every UploadPart
        with pytest.raises(S3ThrottledError, match=rf"^{s3_url}/a\.bin: throttled"):
            store.put("a.bin", np.ones(11 * MiB, dtype=np.uint8))
        proxy.clear()
        assert store.get("a.bin") == b"old"
        assert [o.name for o in store.list_objects()] == ["a.bin"]


def test_error_types_are_storage_errors() -> None:
    from hyperpod_agent.checkpoint.errors import CheckpointStorageError

    for cls in (S3AuthError, S3BucketError, S3ThrottledError, S3TruncatedError, S3UnreachableError):
        assert issubclass(cls, S3Error) and issubclass(cls, CheckpointStorageError)


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        ("norange", ": the store ignored the byte range 5-9"),
        ("shiftrange", ": asked for bytes 5-9, got 6-9"),
    ],
)
def test_an_answer_for_other_bytes_than_asked_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, why: str
) -> None:
    # Rewriting the Range header breaks the request's signature: an anonymous server.
    with S3Server(tmp_path / "s3", auth=False) as srv, FaultProxy(srv.port) as proxy:
        use_aws_env(monkeypatch, tmp_path, srv.env(proxy.url))
        with S3Store("s3://ckpt/run1", FAST) as store:
            store.put("a.bin", b"0123456789")
            proxy.inject(fault, 100, methods=("GET",))
            with pytest.raises(S3Error) as e:
                store.read_into("a.bin", np.empty(5, dtype=np.uint8), offset=5, size=10)
    assert e.value.uri == "s3://ckpt/run1/a.bin"
    assert why in _one_line(e.value), e.value
