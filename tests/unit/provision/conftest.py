"""Fixtures for provisioning tests (data in provision_support.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from provision_support import AGENT_UNIT, CONTROLLER_UNIT, MAKEFILE, PLUGIN_BYTES, base_params


@pytest.fixture
def params() -> dict[str, Any]:
    return base_params()


@pytest.fixture
def write_params(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    def write(data: dict[str, Any]) -> Path:
        path = tmp_path / "provisioning_parameters.json"
        path.write_text(json.dumps(data))
        return path

    return write


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "systemd").mkdir(parents=True)
    (root / "systemd" / "hyperpod-agent.service").write_text(AGENT_UNIT)
    (root / "systemd" / "hyperpod-controller.service").write_text(CONTROLLER_UNIT)
    (root / "spank_plugin").mkdir()
    (root / "spank_plugin" / "Makefile").write_text(MAKEFILE)
    (root / "spank_plugin" / "auto_resume.c").write_bytes(PLUGIN_BYTES)
    return root


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    return tmp_path / "root"
