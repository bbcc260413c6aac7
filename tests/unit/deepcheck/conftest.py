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


class Fakes:
    """The fake tools installed in a temporary bin directory, and a scenario file."""

    def __init__(self, root: Path) -> None:
        from hyperpod_agent.deepcheck.fakes import install_fakes

        self.bin = install_fakes(root / "bin")
        self.scenario = root / "scenario.json"
        self.pid_file = root / "pids"
        self.write({})

    def write(self, scenario: dict[str, object]) -> None:
        import json

        self.scenario.write_text(json.dumps(scenario))

    def env(self, node: str = "gpu-001") -> dict[str, str]:
        from hyperpod_agent.deepcheck.fakes import fake_env

        # only the fakes and the system's basic tools: a real dcgmi or nvidia-smi
        # installed on the test machine must not answer
        return fake_env(self.bin, self.scenario, node, base={"PATH": "/usr/bin:/bin"})

    def pids(self) -> list[int]:
        return [int(p) for p in self.pid_file.read_text().split()]


@pytest.fixture
def fakes(tmp_path: Path) -> Fakes:
    return Fakes(tmp_path)


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.fixture
def gone() -> Callable[[int], bool]:
    """Whether a process no longer runs: no /proc entry, or a zombie nobody reaped yet
    (a killed grandchild waits there for init)."""
    return _gone
