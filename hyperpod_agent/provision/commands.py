"""Provisioning steps that run a command: install the package into a venv, build the
SPANK plugin, enable a systemd unit, mount a shared filesystem. Every command is an
argument list with a timeout (``run_command``), never a shell.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from hyperpod_agent.provision.steps import (
    Change,
    Context,
    Step,
    StepError,
    read_if_present,
    short_sha,
    write_atomic,
)

COMMAND_TIMEOUT_S = 60.0


def run_command(
    argv: list[str], timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (never a shell) with a timeout; StepError if it cannot start or hangs."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False
        )
    except FileNotFoundError:
        raise StepError(f"{argv[0]}: command not found") from None
    except subprocess.TimeoutExpired:
        raise StepError(f"{' '.join(argv[:3])}: timed out after {timeout:g} s") from None


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    text = (proc.stderr or proc.stdout or "").strip().splitlines()
    return text[-1] if text else "no output"


class InstallPackage(Step):
    """A venv with the package installed; a marker records what was installed."""

    network = True

    def __init__(self, venv: Path, spec: str, python: str, timeout: float = 900.0) -> None:
        self.venv, self.spec, self.python, self.timeout = venv, spec, python, timeout
        self.name = f"install {spec} into {venv}"
        self.marker = venv / ".hyperpod-installed"

    def _wanted(self) -> str:
        spec = Path(self.spec)
        digest = short_sha(spec.read_bytes()) if spec.is_file() else ""
        return f"{self.spec} {digest}".strip() + "\n"

    def inspect(self, ctx: Context) -> Change | None:
        current = read_if_present(self.marker)
        if (self.venv / "bin" / "python").exists() and current == self._wanted().encode():
            return None
        return Change("create venv and pip install" if current is None else "reinstall")

    def apply(self, ctx: Context) -> None:
        if not (self.venv / "bin" / "python").exists():
            self._run([self.python, "-m", "venv", str(self.venv)], COMMAND_TIMEOUT_S)
        pip = [str(self.venv / "bin" / "python"), "-m", "pip", "install", "--upgrade", self.spec]
        self._run(pip, self.timeout)
        write_atomic(self.marker, self._wanted().encode(), 0o644)

    def _run(self, argv: list[str], timeout: float) -> None:
        proc = run_command(argv, timeout)
        if proc.returncode != 0:
            raise StepError(f"{' '.join(argv[:4])}: exit {proc.returncode}: {last_line(proc)}")


class Build(Step):
    """``make -C DIR``; up to date when ``make -q`` says so."""

    def __init__(self, directory: Path, timeout: float = 300.0) -> None:
        self.dir, self.timeout, self.name = directory, timeout, f"build {directory}"

    def inspect(self, ctx: Context) -> Change | None:
        if not (self.dir / "Makefile").is_file():
            raise StepError(f"{self.dir}/Makefile: no such file (is --source the repository?)")
        proc = run_command(["make", "-q", "-C", str(self.dir)], COMMAND_TIMEOUT_S, ctx.env)
        return None if proc.returncode == 0 else Change("make")

    def apply(self, ctx: Context) -> None:
        proc = run_command(["make", "-C", str(self.dir)], self.timeout, ctx.env)
        if proc.returncode != 0:
            raise StepError(f"make -C {self.dir}: exit {proc.returncode}: {last_line(proc)}")


class SystemdEnable(Step):
    """A unit enabled and running; restarted when a step it depends on changed."""

    def __init__(self, unit: str, restart_on: list[str], timeout: float = 30.0) -> None:
        self.unit, self.restart_on, self.timeout = unit, restart_on, timeout
        self.name = f"enable {unit}"

    def _query(self, verb: str) -> str:
        proc = run_command(["systemctl", verb, self.unit], self.timeout)
        return proc.stdout.strip()

    def inspect(self, ctx: Context) -> Change | None:
        needs = []
        if self._query("is-enabled") != "enabled":
            needs.append("enable")
        if self._query("is-active") != "active":
            needs.append("start")
        elif ctx.changed & set(self.restart_on):
            needs.append("restart (its files changed)")
        return Change(", ".join(needs)) if needs else None

    def apply(self, ctx: Context) -> None:
        restart = bool(ctx.changed & set(self.restart_on))
        for argv in (
            ["daemon-reload"],
            ["enable", self.unit],
            ["restart" if restart else "start", self.unit],
        ):
            proc = run_command(["systemctl", *argv], self.timeout)
            if proc.returncode != 0:
                raise StepError(f"systemctl {' '.join(argv)}: {last_line(proc)}")


def mounted(path: str, mountinfo: Path = Path("/proc/self/mountinfo")) -> bool:
    """Whether ``path`` is a mount point (field 5 of mountinfo)."""
    try:
        text = mountinfo.read_text()
    except OSError:
        return False
    return any(line.split()[4:5] == [path] for line in text.splitlines())


class Mount(Step):
    """A shared filesystem mounted at its fstab entry's path."""

    network = True

    def __init__(
        self,
        path: str,
        required: bool,
        timeout: float = 120.0,
        is_mounted: Callable[[str], bool] = mounted,
    ) -> None:
        self.path, self.optional, self.timeout = path, not required, timeout
        self.is_mounted = is_mounted
        self.name = f"mount {path}"

    def inspect(self, ctx: Context) -> Change | None:
        return None if self.is_mounted(self.path) else Change("mount")

    def apply(self, ctx: Context) -> None:
        Path(self.path).mkdir(parents=True, exist_ok=True)
        proc = run_command(["mount", self.path], self.timeout)
        if proc.returncode != 0:
            raise StepError(f"mount {self.path}: exit {proc.returncode}: {last_line(proc)}")
