"""Checks that end a provisioning run: is the node doing its job now?"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path

from hyperpod_agent.provision.commands import run_command
from hyperpod_agent.provision.steps import StepError

POLL_S = 2.0


class Check(ABC):
    name: str

    @abstractmethod
    def run(self, sleep: Callable[[float], None] = time.sleep) -> str:
        """One line saying what was seen; StepError when the check fails."""


def _poll(
    what: Callable[[], tuple[bool, str]], timeout: float, sleep: Callable[[float], None]
) -> str:
    """Call ``what`` until it succeeds or ``timeout`` passes; the last line either way."""
    deadline = time.monotonic() + timeout
    while True:
        ok, line = what()
        if ok:
            return line
        if time.monotonic() >= deadline:
            raise StepError(f"{line} (still failing after {timeout:g} s)")
        sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


class OneAgentCycle(Check):
    """``hyperpod agent run --once``: every probe once, exit 0 unless the node is faulty."""

    def __init__(self, hyperpod: list[str], config: Path, timeout: float = 120.0) -> None:
        self.argv = [*hyperpod, "agent", "run", "--once", "--config", str(config)]
        self.timeout = timeout
        self.name = "verify: agent reports healthy"

    def run(self, sleep: Callable[[float], None] = time.sleep) -> str:
        proc = run_command(self.argv, self.timeout)
        out = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
        line = out[-1] if out else f"exit {proc.returncode}"
        if proc.returncode != 0:
            raise StepError(f"agent run --once: exit {proc.returncode}: {line}")
        return line


class HealthCacheOk(Check):
    """``hyperpod health-check``: the running agent's cache says the node is healthy."""

    def __init__(self, hyperpod: list[str], config: Path, timeout: float) -> None:
        self.argv = [*hyperpod, "health-check", "--config", str(config)]
        self.timeout = timeout
        self.name = "verify: agent reports healthy"

    def run(self, sleep: Callable[[float], None] = time.sleep) -> str:
        def once() -> tuple[bool, str]:
            proc = run_command(self.argv, 30.0)
            text = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
            return proc.returncode == 0, text[-1] if text else f"exit {proc.returncode}"

        return _poll(once, self.timeout, sleep)


class ControllerAnswers(Check):
    """GET /v1/healthz answers 200 on one of the controllers: a standby answers too."""

    def __init__(self, urls: Sequence[str], timeout: float) -> None:
        self.urls = [f"{url}/v1/healthz" for url in urls]
        self.timeout = timeout
        self.name = (
            f"verify: controller answers {self.urls[0]}"
            if len(self.urls) == 1
            else f"verify: a controller answers {' or '.join(self.urls)}"
        )

    def run(self, sleep: Callable[[float], None] = time.sleep) -> str:
        def ask(url: str) -> tuple[bool, str]:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310
                    return resp.status == 200, f"{url}: HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                return False, f"{url}: HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                return False, f"{url}: {reason}"

        def once() -> tuple[bool, str]:
            failed = []
            for url in self.urls:
                ok, line = ask(url)
                if ok:
                    return True, line
                failed.append(line)
            return False, "; ".join(failed)

        return _poll(once, self.timeout, sleep)
