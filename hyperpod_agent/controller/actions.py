"""The executor: the only code that applies the policy's plan to Slurm.

Every action goes intent (committed, fsynced) -> apply -> done/failed/abandoned. Open
intents are reconciled with Slurm's actual state before anything else on every pass,
and so on start-up: an intent already visible in Slurm is marked done, one that is not
is applied once, after re-reading its node (``intents.changed_hands``) and only while
it is young enough. An action's state, the job accounting it implies and its event are
written in one transaction, so a crash at any point yields one action, counted once,
told once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from hyperpod_agent.controller import intents, metrics, records
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.crash import crash_from_env
from hyperpod_agent.controller.gate import Gate, Refused, gated
from hyperpod_agent.controller.intent_log import IntentLog
from hyperpod_agent.controller.isolation import Isolation
from hyperpod_agent.controller.observe import WouldHave
from hyperpod_agent.controller.providers.base import (
    Provider,
    ProviderError,
    SlurmApi,
)
from hyperpod_agent.controller.replacing import Keepalive, Replacements
from hyperpod_agent.controller.snapshot import Decision, Kind, PlannedAction
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.lease import Lease
from hyperpod_agent.controller.store.log import MAX_MESSAGE
from hyperpod_agent.controller.store.rows import ActionRow
from hyperpod_agent.errors import SlurmError
from hyperpod_agent.slurm.models import Job, Node
from hyperpod_agent.text import printable

log = logging.getLogger(__name__)

# Flap damping: these are not repeated on the same node within ``policy.cooldown_s``.
# Drains are never delayed: a faulty node must leave service at once.
COOLDOWN_KINDS = (Kind.RESUME.value, Kind.REBOOT.value, Kind.REPLACE.value)


class Executor:
    """Applies PlannedActions with an intent log, cooldowns, retries and dry-run."""

    def __init__(
        self,
        store: Store,
        slurm: SlurmApi | Gate,
        provider: Provider,
        config: ControllerConfig,
        crash_hook: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.slurm = gated(slurm, (config.slurm_user,))
        self.provider = provider
        self.config = config
        self._crash_hook = crash_hook if crash_hook is not None else crash_from_env
        self.log = IntentLog(store, config)
        # the hook looked up when called: a test sets the executor's after construction
        self.replacements = Replacements(
            self.slurm, provider, config, self.log, lambda point: self._crash_hook(point)
        )
        # Observe mode: the decisions of the last pass, (kind, target) -> fault code.
        self.would_have = WouldHave(store)
        # Each intent and action on its own: one that raises is skipped, not the pass.
        self.isolation = Isolation(store.add_event, time.time)

    @property
    def fence(self) -> Lease | None:
        """The leader's lease while a pass runs with [ha]: every intent write is fenced
        with it, so a deposed leader writes none (LeaseLost ends its pass)."""
        return self.log.fence

    @fence.setter
    def fence(self, lease: Lease | None) -> None:
        self.log.fence = lease

    @property
    def keepalive(self) -> Keepalive | None:
        """Called while a long provider command runs (the systemd watchdog ping)."""
        return self.replacements.keepalive

    @keepalive.setter
    def keepalive(self, ping: Keepalive | None) -> None:
        self.replacements.keepalive = ping

    # -- the plan -------------------------------------------------------------------
    def execute(
        self, decision: Decision, nodes: Mapping[str, Node], jobs: Sequence[Job], now: float
    ) -> list[int]:
        """Record the decision's events and apply its actions; returns new action ids."""
        for ev in decision.events:
            self.store.add_event(
                ev.kind, ev.message, now, node=ev.node, job_id=ev.job_id, cause=ev.cause
            )
            log.warning("%s", printable(ev.message, MAX_MESSAGE))
        ids: list[int] = []
        promised: set[str] = set()  # spares already given to a replacement in this pass
        # In observe mode a decision that stands pass after pass is logged once, and
        # again only after it was not made for a pass.
        self.would_have.begin_pass()
        for pa in decision.actions:
            aid = self.isolation.run(
                "action",
                f"{pa.kind.value} {intents.target(pa)}",
                partial(self._execute_one, pa, nodes, promised, now),
                None,
                node=pa.node,
                job_id=pa.job_id,
            )
            if aid is not None:
                ids.append(aid)
        self.would_have.end_pass()
        return ids

    def _execute_one(
        self, pa: PlannedAction, nodes: Mapping[str, Node], promised: set[str], now: float
    ) -> int | None:
        """One planned action: recorded, or an intent written and applied (its id)."""
        if pa.kind in (Kind.EXHAUST, Kind.NOT_RETRIED):
            records.job_verdict(self.store, pa, now)
            return None
        if pa.kind is Kind.FINDING:
            records.finding(self.store, pa, now)
            return None
        if self.config.policy.observe:
            self.would_have.tell(pa, now)
            return None
        if pa.kind is Kind.CHECK:
            records.check_run(self.store, pa, now)
            return None
        if pa.kind is Kind.STEP_END:
            records.step_end(self.store, pa, now)
            return None
        if self._cooling(pa, now):
            return None
        params = dict(pa.params)
        if pa.node is not None and pa.node in nodes:
            # What the node looked like when planned: the intent applies only while
            # it still does (intents.changed_hands).
            params.setdefault("seen_reason", nodes[pa.node].reason)
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
            kind.value, pa.node, pa.job_id, pa.reason, pa.cause, now, params, fence=self.fence
        )
        self._crash_hook(f"intent:{kind.value}")
        row = self.store.action(aid)
        assert row is not None
        self._apply(row, now)
        return aid

    def _cooling(self, pa: PlannedAction, now: float) -> bool:
        if pa.node is None or pa.admin or pa.kind.value not in COOLDOWN_KINDS:
            return False
        last = self.store.last_done(pa.node, pa.kind.value)
        if last is not None and now - last < self.config.policy.cooldown_s:
            log.debug("%s %s: in cooldown", pa.kind.value, pa.node)
            return True
        return False

    # -- open intents ---------------------------------------------------------------
    def process_open(self, nodes: Mapping[str, Node], jobs: Sequence[Job], now: float) -> int:
        """Finish what earlier passes (or a crashed process) left open.

        Returns how many intents were sent to Slurm now, so the caller re-reads Slurm
        before deciding anything else on the same, now outdated, view.
        """
        by_id = {j.job_id: j for j in jobs}
        applied = 0
        for row in self.store.open_actions():
            applied += self.isolation.run(
                "intent",
                row.id,
                partial(self._open_one, row, nodes, by_id, now),
                0,
                node=row.node,
                job_id=row.job_id,
            )
        return applied

    def _open_one(
        self, row: ActionRow, nodes: Mapping[str, Node], by_id: Mapping[int, Job], now: float
    ) -> int:
        if row.state == "applied":
            return self.replacements.poll(row, nodes, now)
        if row.next_attempt_at > now:
            return 0
        if intents.already_applied(row, nodes, by_id):
            self.log.done(row, now, "found already applied in Slurm")
            return 0
        why = intents.too_old(row, now, self.config.policy.intent_max_age_s)
        if why is not None:
            self.log.abandon(row, why, now)
            return 0
        if self.config.policy.observe:
            return 0
        self._apply(row, now)
        return 1

    def _still_planned(self, row: ActionRow, now: float) -> bool:
        """Re-read the intent's node; abandon the intent if it changed hands."""
        if not intents.touches_node(row):
            return True
        try:
            current = self.slurm.node(str(row.node))
        except SlurmError as exc:
            if f"unknown node {row.node}" in str(exc):
                self.log.abandon(row, "the node is no longer in Slurm", now)
            else:
                self.log.failed_attempt(row, f"re-reading {row.node}: {exc}", now)
            return False
        why = intents.changed_hands(row, current, (self.config.slurm_user,))
        if why is not None:
            self.log.abandon(row, why, now)
            return False
        return True

    def _apply(self, row: ActionRow, now: float) -> None:
        if not self._still_planned(row, now):
            return
        expect = intents.expected_reasons(row)
        try:
            if row.kind in (Kind.DRAIN.value, Kind.HOLD.value):
                self.slurm.drain(str(row.node), row.reason, expect=expect)
            elif row.kind == Kind.RESUME.value:
                self._resume(row, expect)
            elif row.kind == Kind.REBOOT.value:
                self._reboot(row)
            elif row.kind == Kind.REQUEUE.value:
                assert row.job_id is not None
                self.slurm.requeue(row.job_id)
            elif row.kind == Kind.CANCEL.value:
                assert row.job_id is not None
                self.slurm.cancel(row.job_id)
            elif row.kind == Kind.REPLACE.value:
                self.replacements.start(row, now)
                return
            else:
                raise ProviderError(f"unknown action kind {row.kind!r}")
        except Refused as exc:
            self.log.abandon(row, exc.why, now)  # somebody else's since: never retried
            return
        except (SlurmError, ProviderError) as exc:
            self.log.failed_attempt(row, str(exc), now)
            return
        self._crash_hook(f"applied:{row.kind}")
        self.log.done(row, now, counts_attempt=True)

    def _resume(self, row: ActionRow, expect: tuple[str, ...] | None) -> None:
        """Resume the node; an admin's resume through the re-entry gate (``deep_check``)
        instead drains it under its ``hyperpod:check`` reason, and the gate resumes it
        once it passed. A node already in service is left so, never drained for it."""
        node = str(row.node)
        if row.params.get("deep_check") and row.reason and row.params.get("seen_reason"):
            self.slurm.drain(node, row.reason, expect=expect)
            return
        self.slurm.resume(node, expect=expect)

    def _reboot(self, row: ActionRow) -> None:
        """``scontrol reboot ASAP nextstate=resume``: Slurm puts the node back in service
        once it booted. With the re-entry gate the node must pass its deep checks
        first, so it is drained with our reason and rebooted without a next state:
        it stays drained after the boot, for the gate to decide."""
        node = str(row.node)
        deep = self.config.deep_checks
        expect = intents.expected_reasons(row)
        if not (deep.reentry_gate_on and "reboot" in deep.gate_after):
            self.slurm.reboot(node, row.reason, asap=True, next_state="resume", expect=expect)
            return
        self.slurm.drain(node, row.reason, expect=expect)
        self.slurm.reboot(node, row.reason, asap=False, next_state="", expect=expect)

    def _event(self, kind: str, message: str, pa: PlannedAction, now: float) -> None:
        self.store.add_event(kind, message, now, node=pa.node, job_id=pa.job_id, cause=pa.cause)
        log.info("%s", message)
