"""Fixtures shared by the agent's tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from progress_records import proc_state, wait_until


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real process of ours (root), asleep, for progress records to name."""
    proc = subprocess.Popen(["sleep", "120"])
    try:
        wait_until(lambda: proc_state(proc.pid) == "S")  # past exec, in its sleep
        yield proc
    finally:
        proc.kill()
        proc.wait(10)
