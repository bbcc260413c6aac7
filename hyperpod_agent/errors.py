"""Typed exceptions. Each carries the exit code the CLI uses for it."""

from __future__ import annotations


class HyperpodError(Exception):
    """Base class: a failure we can explain in one line."""

    exit_code = 1


class UsageError(HyperpodError):
    """Bad command-line input."""

    exit_code = 2


class ConfigError(HyperpodError):
    """A configuration file is missing, unreadable or invalid."""

    exit_code = 3


class SlurmError(HyperpodError):
    """A Slurm command failed; keeps the command and what it printed."""

    exit_code = 4

    def __init__(self, argv: list[str], returncode: int | None, stderr: str, message: str = ""):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        what = message or f"exited with {returncode}"
        detail = f": {self.stderr.splitlines()[-1]}" if self.stderr else ""
        super().__init__(f"{' '.join(self.argv[:3])}: {what}{detail}")


class SlurmTimeout(SlurmError):
    """A Slurm command did not finish within its timeout."""

    def __init__(self, argv: list[str], timeout: float):
        super().__init__(argv, None, "", f"timed out after {timeout:g} s")
        self.timeout = timeout


class SlurmParseError(SlurmError):
    """Slurm printed something we did not expect."""

    def __init__(self, argv: list[str], why: str):
        super().__init__(argv, 0, "", f"unexpected output: {why}")


class LocalClusterError(HyperpodError):
    """The local cluster could not be started, stopped or inspected."""

    exit_code = 5
