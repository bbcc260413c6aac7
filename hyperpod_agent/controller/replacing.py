"""A replacement's life in the executor: the provider started (once, for one that must
not run twice), polled until the node is back or the attempt timed out, and the node
that came back resumed (or held for the re-entry gate's deep check)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from hyperpod_agent.controller import intents, metrics
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.gate import Gate, Refused
from hyperpod_agent.controller.intent_log import IntentLog
from hyperpod_agent.controller.providers.base import Provider, ProviderError, ReplaceStatus
from hyperpod_agent.controller.store.rows import ActionRow, EventIn
from hyperpod_agent.errors import SlurmError
from hyperpod_agent.slurm.models import Node

log = logging.getLogger("hyperpod_agent.controller.actions")

Keepalive = Callable[[], None]


class Replacements:
    """Starts and follows the provider's replacements of the executor's intents."""

    def __init__(
        self,
        slurm: Gate,
        provider: Provider,
        config: ControllerConfig,
        intent_log: IntentLog,
        crash_hook: Callable[[str], None],
    ) -> None:
        self.slurm = slurm
        self.provider = provider
        self.config = config
        self.log = intent_log
        self.crash_hook = crash_hook
        # Called while a long provider command runs (the systemd watchdog ping).
        self.keepalive: Keepalive | None = None

    def start(self, row: ActionRow, now: float) -> None:
        """Start a replacement. A provider that must not run twice (an admin command)
        is recorded as started first: a controller killed while it runs polls for the
        node afterwards and never runs it again."""
        params = {**row.params, "action_id": row.id}
        if self.provider.runs_once:
            started = {"started_at": now, "interrupted": True, "node": row.node}
            self.log.update(row.id, "applied", now, params={**params, "handle": started})
        try:
            with self.slurm.provider_call(f"replace via {self.provider.name}", str(row.node)):
                handle = self.provider.replace(
                    str(row.node), row.reason, params, now, self.keepalive
                )
        except Refused as exc:
            self.log.abandon(row, exc.why, now)
            return
        except (SlurmError, ProviderError) as exc:
            self.log.failed_attempt(row, str(exc), now)
            return
        self.crash_hook(f"applied:{row.kind}")
        # The node that went into service is named too: its change is an action of ours.
        spare = handle.get("spare") if isinstance(handle, Mapping) else None
        into = f" (spare {spare} into service)" if spare else ""
        message = f"replace {row.node} via {self.provider.name}{into}: {row.cause}"
        self.log.update(
            row.id,
            "applied",
            now,
            attempts=row.attempts + 1,
            params={**params, "handle": handle},
            events=[EventIn("replace_started", message, row.node, row.job_id, row.cause)],
        )
        log.info("%s", message)

    def poll(self, row: ActionRow, nodes: Mapping[str, Node], now: float) -> int:
        """Follow an applied replacement; 1 when it changed Slurm (the node is back)."""
        handle = row.params.get("handle", {})
        status = self.provider.poll(handle, nodes, now)
        if status is ReplaceStatus.PENDING:
            if now - row.updated_at > self.config.policy.replace_timeout_s:
                status = ReplaceStatus.FAILED
            else:
                return 0
        if status is ReplaceStatus.FAILED:
            self._failed(row, handle, now)
            return 0
        self.crash_hook(f"came_back:{row.kind}")
        note = ""
        if self.provider.resumes_node:
            # Only while it still has our replace reason: an admin who drained the node
            # meanwhile keeps it. With the re-entry gate the node that came back is not
            # resumed but handed to the gate, which resumes it once it passed.
            gated = self.config.deep_checks.reentry_gate_on
            try:
                if gated:
                    self.slurm.drain(
                        str(row.node), intents.replaced_reason(row), expect=(row.reason,)
                    )
                    note = "back; held for a deep check before it takes work"
                else:
                    self.slurm.resume(str(row.node), expect=(row.reason,))
            except Refused as exc:
                self.log.done(row, now, f"not {'held' if gated else 'resumed'}: {exc.why}")
                return 1
            except SlurmError as exc:
                log.warning("resume %s after replacement: %s (retrying)", row.node, exc)
                return 0
        self.log.done(row, now, note, measured=True)
        return 1

    def _failed(self, row: ActionRow, handle: Mapping[str, object], now: float) -> None:
        why = "replacement did not complete"
        if handle.get("interrupted"):
            why += " (the controller stopped while its command ran; not run again)"
        event = EventIn(
            "action_failed", f"replace {row.node}: {why}", row.node, row.job_id, row.cause
        )
        self.log.update(row.id, "failed", now, error=why, events=[event])
        metrics.ACTIONS.labels(row.kind, "failed").inc()
