"""Release artefacts: sdist -> wheel -> a fresh virtualenv, all offline.

The sdist is built with setuptools' PEP 517 backend from a clean copy of the tree (an
in-tree build would reuse a stale ``build/`` and could ship deleted modules); the wheel
is built by pip from the unpacked sdist, as a user or a distribution would. The fresh
venv gets the wheel with ``--no-deps``; its dependencies come from this interpreter's
site-packages through a .pth file, so nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from setuptools import find_packages

from hyperpod_agent.cli import COMMANDS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
SCRIPTS = PYPROJECT["project"]["scripts"]
_IGNORE_NAMES = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.pyc",
    ".*_cache",
    ".hypothesis",
    "*.so",
    "*.o",
)


def ignore(directory: str, names: list[str]) -> set[str]:
    """Build outputs, caches, and anything that is not a file or a directory (sockets)."""
    skipped = set(_IGNORE_NAMES(directory, names))
    for name in names:
        path = Path(directory, name)
        if not (path.is_file() or path.is_dir()):
            skipped.add(name)
    return skipped


TIMEOUT = 180


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path
    venv: Path

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def clean_env(venv: Path) -> dict[str, str]:
    """The venv's bin first on PATH; nothing that would find the source tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    tmp = tmp_path_factory.mktemp("pkg")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=ignore)

    out = tmp / "dist"
    code = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    name = run([sys.executable, "-c", code, str(out)], cwd=src).strip().splitlines()[-1]
    sdist = out / name

    unpacked = tmp / "unpacked"
    with tarfile.open(sdist) as tar:
        tar.extractall(unpacked, filter="data")
    (top,) = unpacked.iterdir()
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(top),
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(out),
        ],
        cwd=tmp,
    )
    (wheel,) = out.glob("*.whl")

    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    vpy = venv / "bin" / "python"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(vpy),
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            str(wheel),
        ],
        cwd=tmp,
    )
    purelib = run(
        [str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp
    ).strip()
    # A plain path line: .pth files inside the added directory (the editable install's
    # finder) are not processed, so hyperpod_agent resolves to the installed wheel.
    Path(purelib, "_hyperpod_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return Built(sdist, wheel, venv)


def source_files() -> set[str]:
    """Every file of the package in the source tree, as a relative posix path."""
    pkg = ROOT / "hyperpod_agent"
    return {
        p.relative_to(ROOT).as_posix()
        for p in pkg.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in {".pyc", ".so"}
    }


def sdist_names(b: Built) -> set[str]:
    with tarfile.open(b.sdist) as tar:
        return {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}


def wheel_names(b: Built) -> set[str]:
    with zipfile.ZipFile(b.wheel) as z:
        return set(z.namelist())


def wheel_text(b: Built, suffix: str) -> str:
    with zipfile.ZipFile(b.wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(suffix)]
        return z.read(name).decode()


# ---------------------------------------------------------------- sdist


def test_sdist_has_the_package_and_build_files(built: Built) -> None:
    names = sdist_names(built)
    assert built.sdist.name == f"hyperpod_agent-{VERSION}.tar.gz"
    assert {"PKG-INFO", "pyproject.toml", "README.md"} <= names
    assert source_files() - names == set()


def test_sdist_has_the_deployment_files(built: Built) -> None:
    # provision and the SPANK build read these from a source tree (hyperpod provision
    # --source); a release tarball without them cannot deploy a node.
    names = sdist_names(built)
    wanted = {
        "systemd/hyperpod-agent.service",
        "systemd/hyperpod-controller.service",
        "spank_plugin/Makefile",
        "spank_plugin/auto_resume.c",
        "lifecycle_scripts/on_create.sh",
    }
    assert wanted - names == set()


# ---------------------------------------------------------------- wheel


def test_wheel_has_every_file_and_package(built: Built) -> None:
    names = wheel_names(built)
    assert built.wheel.name == f"hyperpod_agent-{VERSION}-py3-none-any.whl"
    assert "hyperpod_agent/py.typed" in names
    assert source_files() - names == set()
    templates = ROOT / "hyperpod_agent" / "localcluster" / "templates"
    if templates.is_dir():
        assert any(n.startswith("hyperpod_agent/localcluster/templates/") for n in names)
    packages = find_packages(str(ROOT), include=["hyperpod_agent*"])
    assert packages
    for pkg in packages:
        assert f"{pkg.replace('.', '/')}/__init__.py" in names, pkg
    # Nothing but the package and its metadata (no tests, no bench).
    tops = {n.split("/")[0] for n in names}
    assert tops == {"hyperpod_agent", f"hyperpod_agent-{VERSION}.dist-info"}


def test_wheel_entry_points(built: Built) -> None:
    text = wheel_text(built, ".dist-info/entry_points.txt")
    lines = {ln.strip() for ln in text.splitlines() if "=" in ln}
    assert lines == {f"{k} = {v}" for k, v in SCRIPTS.items()}
    assert set(SCRIPTS) == {"hyperpod", "hyperpod-agent", "hyperpod-controller"}


def test_wheel_metadata(built: Built) -> None:
    meta = wheel_text(built, ".dist-info/METADATA")
    assert f"Version: {VERSION}" in meta
    assert "Requires-Python: >=3.11" in meta
    requires = {
        ln.split(":", 1)[1].strip()
        for ln in meta.splitlines()
        if ln.startswith("Requires-Dist:") and "extra ==" not in ln
    }
    assert {str(Requirement(r)) for r in requires} == {
        str(Requirement(d)) for d in PYPROJECT["project"]["dependencies"]
    }


# ---------------------------------------------------------------- installed


def test_installed_cli_runs_from_the_wheel(built: Built, tmp_path: Path) -> None:
    env = clean_env(built.venv)
    out = run([str(built.bin("hyperpod")), "--version"], cwd=tmp_path, env=env)
    assert out.strip() == f"hyperpod, version {VERSION}"
    code = "import hyperpod_agent; print(hyperpod_agent.__file__)"
    where = run([str(built.bin("python")), "-c", code], cwd=tmp_path, env=env)
    assert Path(where.strip()).is_relative_to(built.venv), where
    # --help imports every subcommand's module for its summary: all are in the wheel.
    helptext = run([str(built.bin("hyperpod")), "--help"], cwd=tmp_path, env=env)
    for name in COMMANDS:
        assert f"  {name} " in helptext, name
    for daemon in ("hyperpod-agent", "hyperpod-controller"):
        text = run([str(built.bin(daemon)), "--help"], cwd=tmp_path, env=env)
        assert "--config" in text, daemon


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_script(built: Built, tmp_path: Path, shell: str) -> None:
    env = clean_env(built.venv) | {"_HYPERPOD_COMPLETE": f"{shell}_source"}
    script = run([str(built.bin("hyperpod"))], cwd=tmp_path, env=env)
    assert "_hyperpod_completion" in script
    assert "_HYPERPOD_COMPLETE=" in script


def test_bash_completion_completes(built: Built, tmp_path: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.fail("bash not found")
    script = (
        'eval "$(_HYPERPOD_COMPLETE=bash_source hyperpod)"\n'
        "complete -p hyperpod\n"
        'COMP_WORDS=(hyperpod local-cluster ""); COMP_CWORD=2\n'
        "_hyperpod_completion hyperpod\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
        "COMP_WORDS=(hyperpod nod); COMP_CWORD=1\n"
        "_hyperpod_completion hyperpod\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = run(
        [bash, "--norc", "--noprofile", "-c", script], cwd=tmp_path, env=clean_env(built.venv)
    ).splitlines()
    assert out[0] == "complete -o nosort -F _hyperpod_completion hyperpod"
    assert {"up", "down", "status", "env"} <= set(out[1:])
    assert {"node", "nodes"} <= set(out[1:])
