"""The previous release's code, run beside this one's on a local cluster.

``git archive <rev> hyperpod_agent`` is extracted once into a cache directory under
/var/tmp keyed by the commit id, and the old daemons run with this venv's python and
``PYTHONPATH=<that directory>``: nothing is installed. ``python -P`` keeps the working
directory (this checkout, whose ``hyperpod_agent`` would come first) off ``sys.path``,
so PYTHONPATH is what the old process imports ahead of the venv's own install.

The old daemons use the local cluster's pid files (``run/proc-<service>.pid``), so the
harness stops them as it stops its own (``Services.stop``, ``local-cluster down``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperpod_agent.errors import LocalClusterError
from hyperpod_agent.localcluster import daemons, procs
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.localcluster.services import to_toml

REPO = Path(__file__).resolve().parents[2]
CACHE = Path("/var/tmp/hyperpod-releases")
PREVIOUS_TAG = "v0.1.0"
PREVIOUS_COMMIT = "46f6c08"  # what PREVIOUS_TAG names, for a clone without tags
GIT_TIMEOUT = 60.0

# Asks the old release's own config model about a config (a JSON document on stdin):
# prints its validation errors as JSON, [] when it accepts the config.
_VALIDATE = """
import json, sys
from pydantic import ValidationError
if sys.argv[1] == "agent":
    from hyperpod_agent.agent.config import AgentConfig as Model
else:
    from hyperpod_agent.controller.config import ControllerConfig as Model
try:
    Model.model_validate(json.load(sys.stdin))
    print("[]")
except ValidationError as exc:
    print(json.dumps([
        {"loc": [str(p) for p in e["loc"]], "type": e["type"], "msg": e["msg"]}
        for e in exc.errors()
    ]))
"""


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, timeout=GIT_TIMEOUT, check=False
    )


def resolve(revs: tuple[str, ...] = (PREVIOUS_TAG, PREVIOUS_COMMIT)) -> str | None:
    """The commit id of the first of ``revs`` this clone has, or None (a shallow clone)."""
    for rev in revs:
        found = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        if found.returncode == 0:
            return found.stdout.decode().strip()
    return None


@dataclass(frozen=True)
class Release:
    """One release's ``hyperpod_agent`` package in ``root``, run with this venv."""

    commit: str
    root: Path

    @property
    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.root)}

    def argv(self, *args: str) -> list[str]:
        """``python -P -m hyperpod_agent ARGS`` importing this release's code."""
        return [sys.executable, "-P", "-m", "hyperpod_agent", *args]

    def run(self, argv: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
        """``argv`` (this venv's python) with this release's package first on the path."""
        return subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **self.env},
            check=False,
        )

    def python(self, code: str, *args: str, stdin: str = "") -> str:
        """Run ``code`` with this release's package; its stdout (fails on rc != 0)."""
        res = self.run([sys.executable, "-P", "-c", code, *args], stdin)
        if res.returncode != 0:
            raise AssertionError(f"{self.commit[:9]}: python failed: {res.stderr.strip()}")
        return res.stdout

    def imported(self) -> tuple[Path, str]:
        """Where ``import hyperpod_agent`` finds the package with this release's
        PYTHONPATH, and the version it says."""
        out = self.python("import hyperpod_agent as h; print(h.__file__); print(h.__version__)")
        where, version = out.split()
        return Path(where), version

    def config_errors(self, kind: str, config: dict[str, Any]) -> list[dict[str, Any]]:
        """What this release's ``AgentConfig`` (``kind="agent"``) or ``ControllerConfig``
        says about ``config``: its validation errors, [] when it accepts it."""
        errors: list[dict[str, Any]] = json.loads(
            self.python(_VALIDATE, kind, stdin=json.dumps(config, default=str))
        )
        return errors

    def fit_config(self, kind: str, config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """``config`` with the keys this release does not know removed (it refused
        unknown keys), asked of its own model; the config and the dotted keys dropped.
        Any other error fails: a key both releases know must mean the same."""
        fitted = json.loads(json.dumps(config, default=str))
        dropped: list[str] = []
        for _ in range(50):
            errors = self.config_errors(kind, fitted)
            if not errors:
                return fitted, dropped
            other = [e for e in errors if e["type"] != "extra_forbidden"]
            if other:
                raise AssertionError(f"{kind} config refused by {self.commit[:9]}: {other}")
            for error in errors:
                section = fitted
                for part in error["loc"][:-1]:
                    section = section[part]
                section.pop(error["loc"][-1], None)
                dropped.append(".".join(error["loc"]))
        raise AssertionError(f"{kind} config: keys kept failing: {dropped}")

    def validate_file(self, kind: str, path: Path) -> None:
        """``hyperpod config validate`` of this release on the file its daemon reads."""
        res = self.run(self.argv("config", "validate", "--kind", kind, str(path)))
        if res.returncode != 0:
            raise AssertionError(
                f"{path}: refused by {self.commit[:9]}: {res.stdout.strip()} {res.stderr.strip()}"
            )


def checkout(commit: str) -> Release:
    """This repository's ``hyperpod_agent`` at ``commit``, extracted once under CACHE
    (an extraction is renamed into place whole, so a half one is never reused)."""
    dest = CACHE / commit
    if not (dest / "hyperpod_agent" / "__init__.py").exists():
        archive = _git("archive", "--format=tar", commit, "hyperpod_agent")
        if archive.returncode != 0:
            raise AssertionError(f"git archive {commit}: {archive.stderr.decode().strip()}")
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = CACHE / f".{commit}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        try:
            tmp.rename(dest)
        except OSError:  # another run put it there first
            shutil.rmtree(tmp, ignore_errors=True)
    return Release(commit, dest)


# ------------------------------------------------------------------ daemons
def _start(cluster: LocalCluster, release: Release, name: str, args: list[str]) -> int:
    pidfile = cluster.dir / "run" / f"proc-{name}.pid"
    if procs.read_pidfile(pidfile) is not None:
        raise LocalClusterError(f"{name} still runs: stop it first")
    pid = daemons.start_process(cluster.shape, release.argv(*args), f"{name}.log", release.env)
    procs.write_pidfile(pidfile, pid)
    return pid


def write_config(
    cluster: LocalCluster, release: Release, name: str, config: dict[str, Any]
) -> Path:
    """``etc/<name>.<commit>.toml``: a config beside the current release's own."""
    path = cluster.dir / "etc" / f"{name}.{release.commit[:9]}.toml"
    path.write_text(to_toml(config))
    return path


def start_agent(cluster: LocalCluster, release: Release, node: str, config: Path) -> int:
    """Replace ``node``'s agent by ``release``'s, reading ``config``; its pid."""
    cluster.services.stop(f"agent-{node}")
    return _start(cluster, release, f"agent-{node}", ["agent", "run", "--config", str(config)])


def start_controller(
    cluster: LocalCluster, release: Release, config: Path, timeout: float = 30.0
) -> int:
    """Replace the controller by ``release``'s, reading ``config``, and wait until it
    answers; its pid."""
    services = cluster.services
    services.stop("controller")
    pid = _start(cluster, release, "controller", ["controller", "run", "--config", str(config)])
    # The harness starts a controller only when its pid file names none running: with
    # ours in it, it waits for ours to answer (or fails naming the log if it exits).
    answered = services.start_controller(timeout)
    if answered != pid:
        raise LocalClusterError(f"controller pid {answered}, not the {release.commit[:9]} one")
    return pid
