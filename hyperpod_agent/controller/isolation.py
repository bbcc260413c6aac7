"""One bad item never stops a pass.

Every job, node, intent, check run and surgery a pass handles goes through
``Isolation.run``: an exception there (a job name, reason or comment no one planned for,
a bug) is logged with the item, counted in ``hyperpod_pass_item_errors_total{kind}``,
recorded as one event per item, and the pass goes on with the next item. An item that
fails ``quarantine_after`` passes in a row is quarantined: skipped, with an event, and
tried again once every ``retry_quarantined_s``; while any item is quarantined the
controller reports itself degraded (``/v1/healthz``, ``hyperpod status``).

``LeaseLost`` is not an item's failure: it ends the pass, as it must.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.store.lease import LeaseLost
from hyperpod_agent.text import printable

log = logging.getLogger(__name__)

T = TypeVar("T")

QUARANTINE_AFTER = 3  # passes in a row
RETRY_QUARANTINED_S = 600.0
MAX_MESSAGE = 300  # an exception's text can carry what a user wrote: bounded in the event


@dataclass
class _Failing:
    count: int
    quarantined_at: float | None = None


class Isolation:
    """Runs each item of a pass on its own; remembers which keep failing."""

    def __init__(
        self,
        add_event: Callable[..., object],
        clock: Callable[[], float],
        quarantine_after: int = QUARANTINE_AFTER,
        retry_quarantined_s: float = RETRY_QUARANTINED_S,
    ) -> None:
        self._add_event = add_event
        self._clock = clock
        self.quarantine_after = quarantine_after
        self.retry_quarantined_s = retry_quarantined_s
        self._failing: dict[tuple[str, str], _Failing] = {}

    def run(
        self,
        kind: str,
        item: object,
        fn: Callable[[], T],
        default: T,
        *,
        node: str | None = None,
        job_id: int | None = None,
    ) -> T:
        """``fn()``, or ``default`` when it raises or the item is quarantined."""
        key = (kind, printable(str(item), 80))
        state = self._failing.get(key)
        now = self._clock()
        if state is not None and state.quarantined_at is not None:
            if now - state.quarantined_at < self.retry_quarantined_s:
                return default
            state.quarantined_at = now  # one more try; a failure keeps it quarantined
        try:
            result = fn()
        except LeaseLost:
            raise
        except Exception as exc:  # noqa: BLE001 - the point: one item, not the pass
            self._failed(key, exc, now, node, job_id)
            return default
        if state is not None:
            del self._failing[key]
            if state.quarantined_at is not None:
                log.info("%s %s: handled again; out of quarantine", *key)
                self._event(
                    "item_recovered", f"{key[0]} {key[1]}: handled again", now, node, job_id
                )
        return result

    def _failed(
        self, key: tuple[str, str], exc: Exception, now: float, node: str | None, job_id: int | None
    ) -> None:
        kind, item = key
        metrics.PASS_ITEM_ERRORS.labels(kind).inc()
        state = self._failing.setdefault(key, _Failing(0))
        state.count += 1
        what = printable(f"{type(exc).__name__}: {exc}", MAX_MESSAGE)
        if state.count == 1:
            log.exception("%s %s: failed; skipped this pass, the pass goes on", kind, item)
            self._event(
                "item_error", f"{kind} {item}: skipped this pass: {what}", now, node, job_id
            )
        if state.count >= self.quarantine_after and state.quarantined_at is None:
            state.quarantined_at = now
            log.error("%s %s: failed %d passes in a row; quarantined", kind, item, state.count)
            self._event(
                "item_quarantined",
                f"{kind} {item}: failed {state.count} passes in a row; left alone, tried again "
                f"every {self.retry_quarantined_s:g} s: {what}",
                now,
                node,
                job_id,
            )

    def _event(
        self, kind: str, message: str, now: float, node: str | None, job_id: int | None
    ) -> None:
        try:
            self._add_event(kind, message, now, node=node, job_id=job_id, cause="isolation")
        except LeaseLost:
            raise
        except Exception:  # noqa: BLE001 - a store hiccup must not undo the isolation
            log.exception("could not record %s", kind)

    def quarantined(self) -> list[str]:
        """``kind item`` of every quarantined item, sorted."""
        return sorted(
            f"{k} {i}" for (k, i), s in self._failing.items() if s.quarantined_at is not None
        )

    def forget_missing(self, kind: str, present: set[str]) -> None:
        """Drop the failure records of ``kind`` items no longer in the pass (a job that
        ended, a run that finished), so they neither linger nor keep us degraded."""
        for key in [k for k in self._failing if k[0] == kind and k[1] not in present]:
            del self._failing[key]
