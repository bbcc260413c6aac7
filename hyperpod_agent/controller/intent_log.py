"""The executor's writes to the intent log: an action's state, the job accounting it
implies and its event, in one transaction each, fenced with the leader's lease."""

from __future__ import annotations

import logging
from typing import Any

from hyperpod_agent.controller import intents, metrics, records
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.snapshot import Kind
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.lease import Lease
from hyperpod_agent.controller.store.rows import ActionRow, EventIn

log = logging.getLogger("hyperpod_agent.controller.actions")

TAKE_OUT_KINDS = (Kind.DRAIN.value, Kind.HOLD.value, Kind.REBOOT.value, Kind.REPLACE.value)


class IntentLog:
    """Moves an action to its next state: retried, failed, abandoned or done."""

    def __init__(self, store: Store, config: ControllerConfig) -> None:
        self.store = store
        self.config = config
        # The leader's lease while a pass runs with [ha]: every intent write is fenced
        # with it, so a deposed leader writes none (LeaseLost ends its pass).
        self.fence: Lease | None = None

    def update(self, action_id: int, state: str, now: float, **fields: Any) -> None:
        self.store.update_action(action_id, state, now, fence=self.fence, **fields)

    def failed_attempt(self, row: ActionRow, error: str, now: float) -> None:
        """One more failed attempt: retried after a back-off, failed after the last."""
        attempts = row.attempts + 1
        policy = self.config.policy
        if attempts >= policy.max_attempts:
            message = (
                f"{row.kind} {intents.row_target(row)} failed after {attempts} attempts: {error}"
            )
            self.update(
                row.id,
                "failed",
                now,
                attempts=attempts,
                error=error,
                events=[EventIn("action_failed", message, row.node, row.job_id, row.cause)],
            )
            metrics.ACTIONS.labels(row.kind, "failed").inc()
            log.info("%s", message)
            return
        delay = policy.retry_backoff_s * 2 ** (attempts - 1)
        self.update(
            row.id, "intent", now, attempts=attempts, error=error, next_attempt_at=now + delay
        )
        metrics.ACTIONS.labels(row.kind, "retry").inc()
        log.warning(
            "%s %s failed (attempt %d, retry in %.0f s): %s",
            row.kind,
            intents.row_target(row),
            attempts,
            delay,
            error,
        )

    def abandon(self, row: ActionRow, why: str, now: float) -> None:
        message = f"{row.kind} {intents.row_target(row)} abandoned: {why}"
        self.update(
            row.id,
            "abandoned",
            now,
            error=why,
            events=[EventIn("abandoned", message, row.node, row.job_id, row.cause)],
        )
        metrics.ACTIONS.labels(row.kind, "abandoned").inc()
        log.warning("%s", message)

    def done(
        self,
        row: ActionRow,
        now: float,
        note: str = "",
        counts_attempt: bool = False,
        measured: bool | None = None,
    ) -> None:
        """Mark ``row`` done with its accounting and event, in one transaction. A take-out
        is measured (fault to drain) when it is ``measured``, by default when there is no
        ``note`` (one that went otherwise: found applied, not resumed)."""
        job = (
            records.requeued(self.store.job(row.job_id or 0), row, now)
            if row.kind == Kind.REQUEUE.value
            else None
        )
        extra = f" ({note})" if note else ""
        if row.kind == Kind.REQUEUE.value and "attempt" in row.params:
            extra = f" (attempt {row.params['attempt']}/{row.params.get('cap', '?')}){extra}"
        reason = f" reason={row.reason!r}" if row.reason else ""
        message = f"{row.kind} {intents.row_target(row)}{reason}: {row.cause}{extra}"
        self.update(
            row.id,
            "done",
            now,
            attempts=row.attempts + 1 if counts_attempt else None,
            job=job,
            events=[EventIn(row.kind, message, row.node, row.job_id, row.cause)],
        )
        log.info("%s", message)
        metrics.ACTIONS.labels(row.kind, "done").inc()
        if job is not None:
            metrics.REQUEUES.inc()
        first = row.params.get("fault_first_seen")
        if measured is None:
            measured = not note
        if row.kind in TAKE_OUT_KINDS and isinstance(first, int | float) and measured:
            metrics.FAULT_TO_DRAIN.observe(max(0.0, now - float(first)))
