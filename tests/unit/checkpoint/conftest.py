"""Fixtures for the checkpoint tests: tier directories and free loopback ports."""

from __future__ import annotations

import contextlib
import itertools
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hyperpod_agent.checkpoint import Checkpointer

PORT_BASE = 24817
_ports = itertools.count(PORT_BASE + 40)


def free_port() -> int:
    """A loopback port in this suite's range that nothing listens on."""
    for port in _ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("unreachable")


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str = "1m", fstype: str = "tmpfs") -> Iterator[Path]:
    """A real tmpfs of ``size`` (mode 0700, as a job's directory) mounted at ``mnt``
    (``fstype="ramfs"``: a memory file system without O_DIRECT, and without a size limit)."""
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", fstype, "-o", f"size={size},mode=0700", "hp-ckpt-test", str(mnt)],
        check=True,
        timeout=30,
    )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], timeout=30, check=False)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs root)."""
    with tmpfs(tmp_path / "shm") as mnt:
        yield mnt


@pytest.fixture
def tiers(tmp_path: Path) -> dict[str, Path]:
    """A persistent root and two nodes' memory roots."""
    return {
        "persistent": tmp_path / "persistent",
        "mem1": tmp_path / "mem1",
        "mem2": tmp_path / "mem2",
    }


@pytest.fixture
def make_ckpt(tiers: dict[str, Path]) -> Iterator[Callable[..., Checkpointer]]:
    """Build Checkpointers that are closed at the end of the test."""
    made: list[Checkpointer] = []

    def make(**kwargs: Any) -> Checkpointer:
        kwargs.setdefault("memory_dir", tiers["mem1"])
        ckpt = Checkpointer(tiers["persistent"], **kwargs)
        made.append(ckpt)
        return ckpt

    yield make
    for ckpt in made:
        ckpt.close()


def sample_state(step: int) -> dict[str, Any]:
    """A small nested state whose values depend on the step."""
    rng = np.random.default_rng(step)
    return {
        "model": {
            "w": rng.standard_normal((16, 8)).astype(np.float32),
            "b": np.full(8, step, dtype=np.int64),
        },
        "optim": {"state": {0: {"m": rng.standard_normal(32)}}, "lr": 0.1 * step},
        "step": step,
        "tag": f"s{step}",
        "blob": bytes([step % 256]) * 5,
    }


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Deep, bit-exact equality including dtype, shape and container types."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}/{i}")
    elif isinstance(a, np.ndarray | np.generic):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), path
    elif type(a).__module__ == "torch":
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert bytes(a.contiguous().view(-1).view(__import__("torch").uint8).numpy()) == bytes(
            b.contiguous().view(-1).view(__import__("torch").uint8).numpy()
        ), path
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert a == b, path


# ---- S3-compatible persistent tier: a real S3 server (rclone serve s3) ----------------------

AWS_VARS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One rclone S3 server for the session, with a bucket ``ckpt``; tests use their own
    prefixes. Tests that stop or break a server start their own."""
    from tests.s3_server import S3Server

    with S3Server(tmp_path_factory.mktemp("s3")) as srv:
        yield srv


def use_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, values: dict[str, str]) -> None:
    """Make the process's AWS environment exactly ``values``: no profile or file of the
    machine leaks in, and no instance-metadata lookup leaves the loopback."""
    for var in AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config-absent"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials-absent"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for k, v in values.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def s3_url(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, request: pytest.FixtureRequest
) -> str:
    """``s3://ckpt/<test name>`` on the session's server, with the AWS variables set for it."""
    use_aws_env(monkeypatch, tmp_path, s3_server.env())
    return f"s3://ckpt/{request.node.name.replace('[', '-').replace(']', '')}"
