"""lifecycle_scripts/on_create.sh, and the venv step with a local wheel (no network)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from provision_support import base_params, tree

from hyperpod_agent.cli import COMMANDS
from hyperpod_agent.provision.commands import InstallPackage
from hyperpod_agent.provision.steps import Context

REPO = Path(__file__).resolve().parents[3]
ON_CREATE = REPO / "lifecycle_scripts" / "on_create.sh"
TIMEOUT_S = 120


@pytest.fixture
def hyperpod_path(tmp_path: Path) -> str:
    """A PATH whose `hyperpod` has the provision command."""
    if "provision" in COMMANDS:
        return f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    # Until `provision` is registered in hyperpod_agent/cli.py, a stand-in calls the group.
    shim = tmp_path / "bin" / "hyperpod"
    shim.parent.mkdir()
    shim.write_text(
        "#!/bin/sh\nshift\nexec " + sys.executable + " -c 'import sys; "
        "from hyperpod_agent.provision.cli import provision; "
        'provision.main(sys.argv[1:], prog_name="hyperpod provision")\' "$@"\n'
    )
    shim.chmod(0o755)
    return f"{shim.parent}:{os.environ['PATH']}"


def on_create(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        ["bash", str(ON_CREATE), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        check=False,
    )


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "params.json"
    path.write_text(json.dumps(data))
    return path


def test_on_create_twice_then_no_changes(
    hyperpod_path: str, tmp_path: Path, source: Path, prefix: Path
) -> None:
    args = [
        "--params",
        str(write(tmp_path, base_params())),
        "--node",
        "node3",
        "--prefix",
        str(prefix),
        "--skip-install",
        "--skip-verify",
        "--source",
        str(source),
    ]
    first = on_create(hyperpod_path, *args)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == "node3: worker (group gpu): 17 of 18 steps changed"
    second = on_create(hyperpod_path, *args)
    assert second.returncode == 0, second.stderr
    assert second.stdout == "node3: worker (group gpu): no changes (18 steps already as desired)\n"


def test_on_create_dry_run_writes_nothing(
    hyperpod_path: str, tmp_path: Path, source: Path, prefix: Path
) -> None:
    result = on_create(
        hyperpod_path,
        "--params",
        str(write(tmp_path, base_params())),
        "--node",
        "node3",
        "--prefix",
        str(prefix),
        "--skip-install",
        "--dry-run",
        "--source",
        str(source),
    )
    assert result.returncode == 0, result.stderr
    assert "steps would change" in result.stdout
    assert tree(prefix) == {}


def test_on_create_invalid_params(
    hyperpod_path: str, tmp_path: Path, source: Path, prefix: Path
) -> None:
    data = base_params()
    data["login_groups"][0]["nodes"] = ["node2"]
    path = write(tmp_path, data)
    result = on_create(
        hyperpod_path,
        "--params",
        str(path),
        "--node",
        "node3",
        "--prefix",
        str(prefix),
        "--skip-install",
        "--source",
        str(source),
    )
    assert result.returncode == 3
    assert result.stderr == (
        f"hyperpod provision: error: {path}: node node2 is in two groups: login group 'login' "
        "and worker group 'gpu'\n"
    )
    assert not prefix.exists()


def test_on_create_needs_a_node(tmp_path: Path) -> None:
    result = on_create(os.environ["PATH"], "--params", str(write(tmp_path, base_params())))
    assert result.returncode == 2
    assert result.stderr == "on_create.sh: error: give --node NAME or --resource-config FILE\n"


def test_on_create_missing_params(tmp_path: Path) -> None:
    result = on_create(os.environ["PATH"], "--params", str(tmp_path / "nope.json"))
    assert result.returncode == 2
    assert result.stderr == f"on_create.sh: error: {tmp_path / 'nope.json'}: no such file\n"


def tiny_wheel(directory: Path) -> Path:
    """A pure-Python wheel built by hand: installing it needs no network."""
    name = "hp_tiny-1.0.dist-info"
    files = {
        "hp_tiny.py": b"VALUE = 42\n",
        f"{name}/METADATA": b"Metadata-Version: 2.1\nName: hp-tiny\nVersion: 1.0\n",
        f"{name}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{name}/RECORD,,")
    wheel = directory / "hp_tiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(f"{name}/RECORD", "\n".join(record) + "\n")
    return wheel


def test_install_step_with_a_local_wheel(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    step = InstallPackage(venv, str(tiny_wheel(tmp_path)), sys.executable, timeout=TIMEOUT_S)
    ctx = Context()
    change = step.inspect(ctx)
    assert change is not None and change.summary == "create venv and pip install"
    step.apply(ctx)
    assert step.inspect(ctx) is None
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", "import hp_tiny; print(hp_tiny.VALUE)"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    assert out.stdout == "42\n"
    # A different wheel under the same name is a different install.
    Path(step.spec).write_bytes(Path(step.spec).read_bytes() + b"\0")
    changed = step.inspect(ctx)
    assert changed is not None and changed.summary == "reinstall"
