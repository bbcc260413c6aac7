"""The executor: the only code that applies the policy's plan to Slurm.

Every action goes intent (committed, fsynced) -> apply -> done/failed. Open intents
are reconciled with Slurm's actual state before anything else on every pass, and so
on start-up: an intent already visible in Slurm is marked done, one that is not is
applied once. A crash between intent and apply therefore yields exactly one action.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.policy import REBOOT_FLAGS
from hyperpod_agent.controller.providers.base import (
    Provider,
    ProviderError,
    ReplaceStatus,
    SlurmApi,
)
from hyperpod_agent.controller.snapshot import Decision, Kind, PlannedAction
from hyperpod_agent.controller.store import Store
from hyperpod_agent.controller.store_rows import ActionRow, TrackedJob
from hyperpod_agent.errors import SlurmError
from hyperpod_agent.slurm.models import Job, Node

log = logging.getLogger(__name__)

# Test-only hook: exit abruptly right after an intent is committed, to prove that the
# restart applies it exactly once. Never set in production.
CRASH_ENV = "HYPERPOD_TEST_CRASH_AFTER_INTENT"
# Flap damping: these are not repeated on the same node within ``policy.cooldown_s``.
# Drains are never delayed: a faulty node must leave service at once.
COOLDOWN_KINDS = (Kind.RESUME.value, Kind.REBOOT.value, Kind.REPLACE.value)
TAKE_OUT_KINDS = (Kind.DRAIN.value, Kind.HOLD.value, Kind.REBOOT.value, Kind.REPLACE.value)


class Executor:
    """Applies PlannedActions with an intent log, cooldowns, retries and dry-run."""

    def __init__(
        self,
        store: Store,
        slurm: SlurmApi,
        provider: Provider,
        config: ControllerConfig,
        crash_hook: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.slurm = slurm
        self.provider = provider
        self.config = config
        self._crash_hook = crash_hook if crash_hook is not None else _crash_from_env

    # -- the plan -------------------------------------------------------------------
    def execute(
        self, decision: Decision, nodes: Mapping[str, Node], jobs: Sequence[Job], now: float
    ) -> list[int]:
        """Record the decision's events and apply its actions; returns new action ids."""
        for ev in decision.events:
            self.store.add_event(
                ev.kind, ev.message, now, node=ev.node, job_id=ev.job_id, cause=ev.cause
            )
            log.warning("%s", ev.message)
        ids = []
        promised: set[str] = set()  # spares already given to a replacement in this pass
        for pa in decision.actions:
            if pa.kind in (Kind.EXHAUST, Kind.NOT_RETRIED):
                self._job_verdict(pa, now)
                continue
            if self._cooling(pa, now):
                continue
            if self.config.policy.dry_run:
                self._event("dry_run", f"dry-run: would {pa.kind.value} {_target(pa)}", pa, now)
                metrics.ACTIONS.labels(pa.kind.value, "dry_run").inc()
                continue
            params = dict(pa.params)
            kind = pa.kind
            if kind is Kind.REPLACE:
                try:
                    view = {k: v for k, v in nodes.items() if k not in promised}
                    params.update(self.provider.prepare(str(pa.node), view, params))
                    if params.get("spare"):
                        promised.add(str(params["spare"]))
                except ProviderError as exc:
                    # No replacement: still take the broken node out, held for repair under
                    # its replace reason (never auto-resumed), rather than retry every pass.
                    self._event(
                        "no_replacement",
                        f"replace {pa.node}: {exc}; draining it and holding it for repair",
                        pa,
                        now,
                    )
                    metrics.ACTIONS.labels(kind.value, "failed").inc()
                    kind = Kind.DRAIN
            aid = self.store.add_action(
                kind.value, pa.node, pa.job_id, pa.reason, pa.cause, now, params
            )
            self._crash_hook()
            row = self.store.action(aid)
            assert row is not None
            self._apply(row, nodes, now)
            ids.append(aid)
        return ids

    def _cooling(self, pa: PlannedAction, now: float) -> bool:
        if pa.node is None or pa.admin or pa.kind.value not in COOLDOWN_KINDS:
            return False
        last = self.store.last_done(pa.node, pa.kind.value)
        if last is not None and now - last < self.config.policy.cooldown_s:
            log.debug("%s %s: in cooldown", pa.kind.value, pa.node)
            return True
        return False

    def _job_verdict(self, pa: PlannedAction, now: float) -> None:
        """Bookkeeping for a job auto-resume leaves alone: budget spent (for good) or a
        failure on healthy nodes (until a fault on its nodes turns up)."""
        assert pa.job_id is not None
        old = self.store.job(pa.job_id) or TrackedJob(pa.job_id, int(pa.params.get("cap", 0)))
        state, kind = (
            ("exhausted", "budget_spent") if pa.kind is Kind.EXHAUST else ("failed", "not_requeued")
        )
        self.store.upsert_job(
            TrackedJob(
                old.job_id,
                old.cap,
                old.attempts,
                pa.cause,
                state,
                old.last_requeue_at,
                old.acted_restart_count,
                old.resumed_from_step,
                now,
            )
        )
        self._event(kind, f"job {pa.job_id}: not requeued: {pa.cause}", pa, now)

    # -- open intents ---------------------------------------------------------------
    def process_open(self, nodes: Mapping[str, Node], jobs: Sequence[Job], now: float) -> int:
        """Finish what earlier passes (or a crashed process) left open.

        Returns how many intents were sent to Slurm now, so the caller re-reads Slurm
        before deciding anything else on the same, now outdated, view.
        """
        by_id = {j.job_id: j for j in jobs}
        applied = 0
        for row in self.store.open_actions():
            if row.state == "applied":
                applied += self._poll(row, nodes, now)
            elif row.next_attempt_at <= now:
                if _already_applied(row, nodes, by_id):
                    self.store.update_action(row.id, "done", now)
                    self._record_done(row, now, "found already applied in Slurm")
                    continue
                if self.config.policy.dry_run:
                    continue
                self._apply(row, nodes, now)
                applied += 1
        return applied

    def _apply(self, row: ActionRow, nodes: Mapping[str, Node], now: float) -> None:
        try:
            if row.kind in (Kind.DRAIN.value, Kind.HOLD.value):
                self.slurm.drain(str(row.node), row.reason)
            elif row.kind == Kind.RESUME.value:
                self.slurm.resume(str(row.node))
            elif row.kind == Kind.REBOOT.value:
                self.slurm.reboot(str(row.node), row.reason, asap=True, next_state="resume")
            elif row.kind == Kind.REQUEUE.value:
                assert row.job_id is not None
                self.slurm.requeue(row.job_id)
                self._track_requeue(row, now)
            elif row.kind == Kind.REPLACE.value:
                handle = self.provider.replace(str(row.node), row.reason, row.params, now)
                self.store.update_action(
                    row.id,
                    "applied",
                    now,
                    attempts=row.attempts + 1,
                    params={**row.params, "handle": handle},
                )
                self._event_row(
                    "replace_started",
                    f"replace {row.node} via {self.provider.name}: {row.cause}",
                    row,
                    now,
                )
                return
            else:
                raise ProviderError(f"unknown action kind {row.kind!r}")
        except (SlurmError, ProviderError) as exc:
            self._failed_attempt(row, str(exc), now)
            return
        self.store.update_action(row.id, "done", now, attempts=row.attempts + 1)
        self._record_done(row, now)

    def _poll(self, row: ActionRow, nodes: Mapping[str, Node], now: float) -> int:
        handle = row.params.get("handle", {})
        status = self.provider.poll(handle, nodes, now)
        if status is ReplaceStatus.PENDING:
            if now - row.updated_at > self.config.policy.replace_timeout_s:
                status = ReplaceStatus.FAILED
            else:
                return 0
        if status is ReplaceStatus.FAILED:
            self.store.update_action(row.id, "failed", now, error="replacement did not complete")
            metrics.ACTIONS.labels(row.kind, "failed").inc()
            self._event_row(
                "action_failed", f"replace {row.node}: replacement did not complete", row, now
            )
            return 0
        if self.provider.resumes_node:
            try:
                self.slurm.resume(str(row.node))
            except SlurmError as exc:
                log.warning("resume %s after replacement: %s (retrying)", row.node, exc)
                return 0
        self.store.update_action(row.id, "done", now)
        self._record_done(row, now)
        return 1

    def _failed_attempt(self, row: ActionRow, error: str, now: float) -> None:
        attempts = row.attempts + 1
        policy = self.config.policy
        if attempts >= policy.max_attempts:
            self.store.update_action(row.id, "failed", now, attempts=attempts, error=error)
            metrics.ACTIONS.labels(row.kind, "failed").inc()
            self._event_row(
                "action_failed",
                f"{row.kind} {_row_target(row)} failed after {attempts} attempts: {error}",
                row,
                now,
            )
            return
        delay = policy.retry_backoff_s * 2 ** (attempts - 1)
        self.store.update_action(
            row.id, "intent", now, attempts=attempts, error=error, next_attempt_at=now + delay
        )
        metrics.ACTIONS.labels(row.kind, "retry").inc()
        log.warning(
            "%s %s failed (attempt %d, retry in %.0f s): %s",
            row.kind,
            _row_target(row),
            attempts,
            delay,
            error,
        )

    def _track_requeue(self, row: ActionRow, now: float) -> None:
        assert row.job_id is not None
        cap = int(row.params.get("cap", 0))
        old = self.store.job(row.job_id) or TrackedJob(row.job_id, cap)
        self.store.upsert_job(
            TrackedJob(
                row.job_id,
                cap or old.cap,
                old.attempts + 1,
                row.cause,
                "requeued",
                now,
                int(row.params.get("restart_count", 0)),
                old.resumed_from_step,
                now,
            )
        )
        metrics.REQUEUES.inc()

    def _record_done(self, row: ActionRow, now: float, note: str = "") -> None:
        metrics.ACTIONS.labels(row.kind, "done").inc()
        first = row.params.get("fault_first_seen")
        if row.kind in TAKE_OUT_KINDS and isinstance(first, int | float) and not note:
            metrics.FAULT_TO_DRAIN.observe(max(0.0, now - float(first)))
        if row.kind == Kind.REQUEUE.value and note:
            self._track_requeue(row, now)
        extra = f" ({note})" if note else ""
        if row.kind == Kind.REQUEUE.value and "attempt" in row.params:
            extra = f" (attempt {row.params['attempt']}/{row.params.get('cap', '?')}){extra}"
        reason = f" reason={row.reason!r}" if row.reason else ""
        self._event_row(
            row.kind, f"{row.kind} {_row_target(row)}{reason}: {row.cause}{extra}", row, now
        )

    def _event(self, kind: str, message: str, pa: PlannedAction, now: float) -> None:
        self.store.add_event(kind, message, now, node=pa.node, job_id=pa.job_id, cause=pa.cause)
        log.info("%s", message)

    def _event_row(self, kind: str, message: str, row: ActionRow, now: float) -> None:
        self.store.add_event(kind, message, now, node=row.node, job_id=row.job_id, cause=row.cause)
        log.info("%s", message)


def _already_applied(row: ActionRow, nodes: Mapping[str, Node], jobs: Mapping[int, Job]) -> bool:
    """Is the intent visible in Slurm already (applied before a crash)?"""
    node = nodes.get(row.node or "")
    if row.kind in (Kind.DRAIN.value, Kind.HOLD.value):
        return node is not None and node.drained and node.reason.strip() == row.reason.strip()
    if row.kind == Kind.RESUME.value:
        return node is not None and not node.drained
    if row.kind == Kind.REBOOT.value:
        if node is None:
            return False
        rebooted = node.boot_time is not None and node.boot_time.timestamp() > row.created_at
        return bool(node.flags & REBOOT_FLAGS) or rebooted
    if row.kind == Kind.REQUEUE.value:
        job = jobs.get(row.job_id or -1)
        return job is not None and job.restart_count > int(row.params.get("restart_count", 0))
    return False  # replace: the provider's replace() is idempotent for the same params


def _target(pa: PlannedAction) -> str:
    return f"job {pa.job_id}" if pa.job_id is not None else str(pa.node)


def _row_target(row: ActionRow) -> str:
    return f"job {row.job_id}" if row.job_id is not None else str(row.node)


def _crash_from_env() -> None:
    if os.environ.get(CRASH_ENV) == "1":
        log.critical("%s=1: exiting right after committing an intent", CRASH_ENV)
        os._exit(137)
