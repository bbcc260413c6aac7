"""Helpers for the Slurm parser tests: captured output lives in tests/fixtures/slurm."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


@pytest.fixture
def capture() -> Callable[[str], str]:
    """Text of one captured Slurm output, by file name."""

    def read(name: str) -> str:
        return (FIXTURES / name).read_text(encoding="utf-8")

    return read


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """scontrol prints local time; the captures were taken on a UTC host."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
