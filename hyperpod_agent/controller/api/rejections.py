"""Counting and logging refused API requests.

Every refusal is counted by its error code (``hyperpod_api_rejections_total{code}``:
the codes are a fixed list, so the label stays bounded) and logged, but at most once a
minute per (code, caller): a hostile client must not be able to flood the log, nor
hide in it. What a minute held back is summed up in one line when the minute is over.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import Scope

from hyperpod_agent.auth.config import Identity, describe
from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.api.models import ERROR_CODES

log = logging.getLogger(__name__)

WINDOW_S = 60.0
# Callers tracked one by one; past that, refusals of a code share one line a minute.
MAX_CALLERS = 1024
OTHER_CALLERS = "other callers"
MAX_FIELD = 200  # characters of a path or message in a log line


@dataclass
class _Window:
    started: float
    status: int
    held: int = 0


class Rejections:
    """Counts every refusal; logs the first per (code, caller) each ``window_s``."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = WINDOW_S,
        max_callers: int = MAX_CALLERS,
    ) -> None:
        self.clock = clock
        self.window_s = window_s
        self.max_callers = max_callers
        self._windows: dict[tuple[str, str], _Window] = {}
        self._due = math.inf
        # Refusals come from the event loop and from FastAPI's worker threads.
        self._lock = threading.Lock()

    def record(
        self, status: int, code: str, message: str, caller: str, method: str, path: str
    ) -> None:
        """Count one refusal and log it unless its (code, caller) was logged this window."""
        label = code if code in ERROR_CODES else "other"
        metrics.API_REJECTIONS.labels(label).inc()
        metrics.REPORTS.labels("request", label).inc()
        with self._lock:
            now = self.clock()
            summaries = self._take_due(now)
            key = (code, caller)
            if key not in self._windows and len(self._windows) >= self.max_callers:
                key = (code, OTHER_CALLERS)
            window = self._windows.get(key)
            if window is not None:
                window.held += 1
            else:
                self._windows[key] = _Window(now, status)
                self._due = min(self._due, now + self.window_s)
        for line in summaries:
            log.warning("%s", line)
        if window is None:
            who = caller if key[1] == caller else f"{caller} and {OTHER_CALLERS}"
            log.warning(
                "refused %s %s from %s: %d %s: %s",
                clean(method, 16),
                clean(path),
                clean(who),
                status,
                code,
                clean(message),
            )

    def flush(self) -> None:
        """Log the summaries of windows that are over (cheap when none is)."""
        if self.clock() < self._due:
            return
        with self._lock:
            summaries = self._take_due(self.clock())
        for line in summaries:
            log.warning("%s", line)

    def _take_due(self, now: float) -> list[str]:
        if now < self._due:
            return []
        self._due = math.inf
        lines = []
        for (code, caller), window in list(self._windows.items()):
            if now - window.started < self.window_s:
                self._due = min(self._due, window.started + self.window_s)
                continue
            del self._windows[(code, caller)]
            if window.held:
                lines.append(
                    f"held back {window.held} more {window.status} {code} refusals of "
                    f"{clean(caller)} in the last {self.window_s:g} s"
                )
        return lines


def caller(scope: Scope) -> str:
    """Who made a request, for logs: the authenticated identity if any, and the address."""
    client = scope.get("client")
    address = str(client[0]) if client else "unknown address"
    identity = scope.get("state", {}).get("identity")
    if isinstance(identity, Identity):
        return f"{describe(identity)} at {address}"
    return address


def clean(text: str, limit: int = MAX_FIELD) -> str:
    """One printable line of at most ``limit`` characters (paths and messages are the
    caller's own text: no newlines or terminal escapes in our log)."""
    printable = "".join(c if c.isprintable() else "?" for c in text[: limit + 1])
    return printable if len(printable) <= limit else printable[: limit - 3] + "..."
