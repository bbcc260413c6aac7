"""Helpers for the deep-check tests: sample tool output lives in tests/fixtures/deepcheck."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "deepcheck"


@pytest.fixture
def sample() -> Callable[[str], str]:
    """Text of one sample output, by path below tests/fixtures/deepcheck."""

    def read(name: str) -> str:
        return (FIXTURES / name).read_text(encoding="utf-8")

    return read
