"""Fixtures for the progress tests: a job's environment pointing at a private root, and a
reader that decodes a record the way the node agent does (through the file, not the map)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperpod_agent import progress
from hyperpod_agent.progress import format as fmt

JOB, RANK = 4242, 3
_ENV = ("SLURM_JOB_ID", "SLURM_PROCID", "RANK", "HYPERPOD_HANG_FACTOR", "HYPERPOD_HANG_MIN_S")


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """HYPERPOD_PROGRESS_DIR (not created: the first call creates it) and no job yet."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    base = tmp_path / "progress"
    monkeypatch.setenv(fmt.ROOT_ENV, str(base))
    progress.close()  # whatever an earlier test left: start uninitialised
    yield base
    progress.close()


@pytest.fixture
def job(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process is rank RANK of job JOB; returns where its record goes."""
    monkeypatch.setenv("SLURM_JOB_ID", str(JOB))
    monkeypatch.setenv("SLURM_PROCID", str(RANK))
    return fmt.record_path(root, JOB, RANK)


def read_consistent(path: Path, tries: int = 10_000) -> fmt.Record:
    """One whole record, by the seqlock protocol: ``seq`` read on its own before the copy,
    the copy's own and the file's right after must be the same even number."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(tries):
            (first,) = fmt.SEQ.unpack(os.pread(fd, fmt.SEQ.size, fmt.SEQ_OFFSET))
            data = os.pread(fd, fmt.SIZE, 0)
            after = fmt.SEQ.unpack(os.pread(fd, fmt.SEQ.size, fmt.SEQ_OFFSET))[0]
            (before,) = fmt.SEQ.unpack_from(data, fmt.SEQ_OFFSET)
            if before % 2 == 0 and first == before == after:
                return fmt.decode(data)
    finally:
        os.close(fd)
    raise AssertionError(f"{path}: no consistent copy in {tries} reads")


def read(path: Path) -> fmt.Record:
    """The record as the agent reads it (the writer is idle here, one copy is enough)."""
    return fmt.decode(path.read_bytes())


REPO = Path(__file__).parents[3]


def rank_env(root: Path, **extra: str) -> dict[str, str]:
    """The environment of rank RANK of job JOB, recording under ``root``."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        fmt.ROOT_ENV: str(root),
        "SLURM_JOB_ID": str(JOB),
        "SLURM_PROCID": str(RANK),
    }
    env.update(extra)
    return env


def run_python(
    code: str, env: dict[str, str], uid: int | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new interpreter (as ``uid`` through setpriv, with no groups)."""
    cmd = [sys.executable, "-c", textwrap.dedent(code)]
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd="/")
