"""Observe mode's memory of what it told (``[policy] mode = "observe"``).

Every automatic action is decided as usual and told as a ``would_have`` event
(records.would_have) instead of applied. A decision that stands pass after pass is
told once, and again only after a pass without it or for another fault.
"""

from __future__ import annotations

from hyperpod_agent.controller import intents, records
from hyperpod_agent.controller.snapshot import Kind, PlannedAction
from hyperpod_agent.controller.store.facade import Store


class WouldHave:
    """The decisions told, pass by pass: (kind, target) -> fault code."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._told: dict[tuple[str, str], str] = {}
        self._now: dict[tuple[str, str], str] = {}

    def begin_pass(self) -> None:
        self._now = {}

    def end_pass(self) -> None:
        self._told = self._now

    def tell(self, pa: PlannedAction, now: float) -> None:
        """What ``pa`` would have done, once while it stands."""
        target = intents.target(pa)
        if pa.kind is Kind.CHECK:
            target = ", ".join(str(n) for n in pa.params.get("nodes", ()))
        # The decision, not its wording: a hang's cause counts its idle seconds up.
        what = str(pa.params.get("fault_code", ""))
        key = (pa.kind.value, target)
        self._now[key] = what
        if self._told.get(key) == what:
            return
        action = "deep_check" if pa.kind is Kind.CHECK else pa.kind.value
        records.would_have(
            self.store, action, target, pa.cause, now, node=pa.node, job_id=pa.job_id
        )
