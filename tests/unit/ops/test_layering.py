"""The layering contracts in pyproject.toml are checked, and they catch a violation.

`lint-imports` runs in the test command; these tests show that it passes on the tree
and fails on a copy of the package with one forbidden import added.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is a dev dependency")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    # The copy's package first on the path, ahead of the editable install's finder.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT), str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "hyperpod_agent", tree / "hyperpod_agent", ignore=shutil.ignore_patterns("*.so")
    )
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def _add_import(tree: Path, module: str, line: str) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{line}\n")


def _broken(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout.split("Broken contracts", 1)[-1] if result.returncode else ""


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        (
            "hyperpod_agent.agent.selfdrain",
            "from hyperpod_agent.controller import metrics as _m  # noqa",
            "The agent and the controller are independent of each other",
        ),
        (
            "hyperpod_agent.slurm.models",
            "from hyperpod_agent.controller import metrics as _m  # noqa",
            "Layers:",
        ),
        (
            "hyperpod_agent.progress.format",
            "import hyperpod_agent.slurm.models as _m  # noqa",
            "What runs inside training jobs",
        ),
        (
            "hyperpod_agent.agent.janitor",
            "import numpy as _np  # noqa",
            "The node agent stays small",
        ),
        (
            "hyperpod_agent.controller.store.rows",
            "from hyperpod_agent.controller.store import facade as _f  # noqa",
            "No import circles",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    tree = _copy(tmp_path)
    assert contract not in _broken(_lint(tree))  # kept before the import is added
    _add_import(tree, module, line)
    result = _lint(tree)
    assert result.returncode != 0
    assert contract in _broken(result), result.stdout
