"""The script probe: site checks as executables, node-problem-detector style.

Each configured executable runs with its arguments (never through a shell) and its
own timeout. Exit code 0 is OK, 1 is FAIL, 2 (and anything else, a timeout or a
failure to start) is UNKNOWN: a broken check must not drain a node. The first
``output_chars`` characters of stdout become the finding's message. All scripts of
one run start at once, so the probe takes as long as the slowest one.
"""

from __future__ import annotations

import logging
import os
import posixpath
import signal
import subprocess
import time
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hyperpod_agent.health import Action, Finding, Status
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAIL, EXIT_UNKNOWN = 0, 1, 2


class ScriptCheck(BaseModel):
    """One ``[[probes.script.scripts]]`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    path: str
    args: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=5.0, gt=0, le=600)
    action: Action = Action.MONITOR
    urgent: bool = False

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"expected an absolute path to an executable, got {value!r}")
        return posixpath.normpath(value)


class ScriptConfig(ProbeConfig):
    """``[probes.script]``. No scripts by default."""

    interval_s: float = Field(default=30.0, gt=0, le=3600)
    scripts: list[ScriptCheck] = Field(default_factory=list)
    output_chars: int = Field(default=256, ge=16, le=480)

    @model_validator(mode="after")
    def _consistent(self) -> ScriptConfig:
        names = [s.name for s in self.scripts]
        if len(set(names)) != len(names):
            raise ValueError(f"scripts: duplicate names in {names}")
        for script in self.scripts:
            if script.timeout_s >= self.timeout_s:
                raise ValueError(
                    f"scripts.{script.name}.timeout_s ({script.timeout_s}) must be below the "
                    f"probe's timeout_s ({self.timeout_s})"
                )
        return self


@dataclass(frozen=True)
class ScriptRun:
    """How one execution ended: an exit code, or a timeout, or an error to start it."""

    returncode: int | None
    stdout: str
    timed_out: bool = False
    error: str | None = None


def judge(script: ScriptCheck, run: ScriptRun, output_chars: int) -> Finding | None:
    """The finding for one script run (pure); None when the script says OK."""
    text = " ".join(run.stdout.split())[:output_chars]
    if run.error is not None:
        status, code, message = Status.UNKNOWN, "script_error", f"couldn't run: {run.error}"
    elif run.timed_out:
        status, code = Status.UNKNOWN, "script_timeout"
        message = f"timed out after {script.timeout_s:g}s"
    elif run.returncode == EXIT_OK:
        return None
    elif run.returncode == EXIT_FAIL:
        status, code, message = Status.FAIL, "script_fail", text or "exit 1"
    else:
        status, code = Status.UNKNOWN, "script_unknown"
        message = f"exit {run.returncode}" + (f": {text}" if text else "")
    failed = status is Status.FAIL
    return Finding(
        component=script.name,
        code=code,
        status=status,
        action=script.action if failed else Action.NONE,
        urgent=script.urgent and failed,
        message=message[:512],
    )


class _Running:
    def __init__(self, script: ScriptCheck) -> None:
        self.script = script
        self.deadline = time.monotonic() + script.timeout_s
        # its own session so a timeout kills the whole tree the script started
        self.proc = subprocess.Popen(
            [script.path, *script.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )

    def finish(self, output_chars: int) -> ScriptRun:
        try:
            out, _ = self.proc.communicate(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._kill()
            return ScriptRun(None, "", timed_out=True)
        return ScriptRun(self.proc.returncode, out[: output_chars * 4].decode(errors="replace"))

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            log.warning(
                "script %s: pid %d did not die after SIGKILL", self.script.name, self.proc.pid
            )


class ScriptProbe(Probe[ScriptConfig]):
    name = "script"
    config_model = ScriptConfig

    def check(self) -> Outcome:
        """Run every configured script once, in parallel, each within its timeout."""
        cfg = self.config
        running: list[_Running] = []
        findings: list[Finding] = []
        for script in cfg.scripts:
            try:
                running.append(_Running(script))
            except OSError as exc:
                finding = judge(script, ScriptRun(None, "", error=exc.strerror), cfg.output_chars)
                if finding is not None:
                    findings.append(finding)
        for run in running:
            finding = judge(run.script, run.finish(cfg.output_chars), cfg.output_chars)
            if finding is not None:
                findings.append(finding)
        return Outcome.from_findings(findings, ok_message=f"{len(cfg.scripts)} script(s) ok")
