"""The agent draining its own node while the controller cannot be reached.

A last resort (DESIGN §1): only with an urgent fault the verdict confirmed, only when
the controller has not answered at all for ``self_drain_after_s`` (a controller that
answers with an error is up and decides for itself), only a node nobody else has taken
out (the one owner check, asked right before the drain), and at most once per
``self_drain_min_interval_s``. In ``mode = "observe"`` it is decided and logged as
"would self-drain", and counted (``hyperpod_agent_would_have_total``); Slurm is untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from hyperpod_agent.health import Action, NodeReport, Verdict
from hyperpod_agent.reasons import Owner, Verb, format_reason, owner_of
from hyperpod_agent.slurm.models import Node

log = logging.getLogger(__name__)

# Owners whose node the agent may drain: in service, or only Slurm's own reason on it.
MAY_DRAIN = (Owner.NONE, Owner.SLURM)


class NodeSlurm(Protocol):
    """What self-drain needs of Slurm (``SlurmClient`` has it)."""

    def node(self, name: str) -> Node: ...

    def drain(self, node: str, reason: str) -> None: ...


def self_drain_reason(report: NodeReport) -> tuple[str, str]:
    """(fault key, Slurm reason) for the most serious urgent finding of ``report``."""
    findings = [f for r in report.results for f in r.findings if f.urgent]
    action, component, code, message = report.action, "node", "fault", report.message
    if findings:
        worst = max(findings, key=lambda f: f.action.rank)
        action, component, code, message = worst.action, worst.component, worst.code, worst.message
    verb = {Action.RESET: Verb.RESET, Action.REBOOT: Verb.REBOOT, Action.REPLACE: Verb.REPLACE}
    reason = format_reason(verb.get(action, Verb.DRAIN), component, code, message)
    return f"{component} {code}", reason


class SelfDrain:
    """Decides and performs self-drains for one node; owned by the reporter's thread."""

    def __init__(
        self,
        node: str,
        slurm: NodeSlurm,
        *,
        enabled: bool,
        after_s: float,
        min_interval_s: float,
        retry_s: float,
        slurm_user: str,
        observe: bool = False,
    ) -> None:
        self.node = node
        # mode = "observe": decided and logged, counted through ``on_would_have``, not done
        self.observe = observe
        self.on_would_have: Callable[[str], None] | None = None
        self.slurm = slurm
        self.enabled = enabled
        self.after_s = after_s
        self.min_interval_s = min_interval_s
        self.retry_s = retry_s
        self.slurm_users = (slurm_user,)
        self._handled: set[str] = set()  # fault keys drained or deliberately left
        self._next = 0.0  # no attempt before (retry back-off, rate limit)
        self._last_drain: float | None = None

    def wanted(self, report: NodeReport) -> bool:
        return (
            self.enabled
            and report.urgent
            and report.verdict == Verdict.FAULTY
            and self_drain_reason(report)[0] not in self._handled
        )

    def due(self, report: NodeReport, down_since: float | None) -> float | None:
        """When to self-drain for ``report``; None when not at all."""
        if down_since is None or not self.wanted(report):
            return None
        return max(down_since + self.after_s, self._next)

    def healthy_again(self) -> None:
        """The node is no longer faulty: the same fault later is a new one."""
        self._handled.clear()

    def run(self, report: NodeReport, now: float, down_for: float) -> None:
        key, reason = self_drain_reason(report)
        try:
            current = self.slurm.node(self.node)
            owner = owner_of(current, self.slurm_users)
            if owner not in MAY_DRAIN:
                self._handled.add(key)
                log.warning(
                    "controller unreachable with an urgent fault (%s), but %s is already "
                    "out of service with reason %r (%s's): not touching it",
                    key,
                    self.node,
                    current.reason,
                    owner.value,
                )
                return
            if self.observe:
                self._would_have(key, reason, down_for, now)
                return
            self.slurm.drain(self.node, reason)
        except Exception as exc:  # noqa: BLE001 - a missing or broken Slurm client included
            self._next = now + self.retry_s
            log.error("self-drain of %s failed (%s); will retry: %s", self.node, reason, exc)
            return
        self._handled.add(key)
        self._last_drain = now
        self._next = now + self.min_interval_s
        log.warning(
            "controller unreachable for %.0f s with an urgent fault: drained %s (%s)",
            down_for,
            self.node,
            reason,
        )

    def _would_have(self, key: str, reason: str, down_for: float, now: float) -> None:
        # As if drained: the same fault is not told again, and the rate limit holds.
        self._handled.add(key)
        self._last_drain = now
        self._next = now + self.min_interval_s
        log.warning(
            "observe: would self-drain %s (%s): controller unreachable for %.0f s with an "
            "urgent fault",
            self.node,
            reason,
            down_for,
        )
        if self.on_would_have is not None:
            self.on_would_have("self_drain")

    def failed_step(self, now: float) -> None:
        """The reporter's step raised: do not retry at once."""
        self._next = max(self._next, now + self.retry_s)
