"""A hang that ends a watched step: what its retry needs to know of it. Pure.

A job whose ``srun --auto-resume`` step is watched by its step-retry helper is not
requeued when it hangs: the pass tells the step to end (the watch's answer), keeping
this record as the cause of its ``step_end`` event, and the step's failure is then
judged by ``stepretry.plan.decide_step`` against it, so the step runs again in the same
job without the suspect node. The record travels through the state store as JSON (in
the event: the store's schema stays one the release before reads), so a standby that
takes over between the end and the retry decides the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hyperpod_agent.controller.hangs.judge import Hang

KEEP = 3  # suspects kept in the record
MAX_JSON = 480  # under the store's bound on an event's cause (500)


@dataclass(frozen=True)
class HangEnd:
    cause: str  # the hang as declared (``Hang.describe``)
    step: int  # the furthest step any rank finished
    suspects: tuple[str, ...]  # the nodes the hang names
    shown: tuple[str, ...]  # those of them whose evidence the node itself shows
    clear: bool  # some, not all, of the job's nodes are suspects

    @classmethod
    def of(cls, hang: Hang) -> HangEnd:
        # A retry replaces one node: more suspects than KEEP only need to say "several".
        suspects = hang.suspects[:KEEP]
        shown = tuple(n for n in hang.shown if n in suspects)
        return cls(hang.describe(), hang.step, suspects, shown, hang.clear)

    def to_json(self) -> str:
        """At most MAX_JSON characters (an event's cause): the cause's text gives way."""
        doc = {
            "cause": self.cause,
            "step": self.step,
            "suspects": list(self.suspects),
            "shown": list(self.shown),
            "clear": self.clear,
        }
        text = json.dumps(doc, sort_keys=True)
        if len(text) > MAX_JSON:
            over = len(text) - MAX_JSON
            doc["cause"] = self.cause[: max(0, len(self.cause) - over - 3)] + "..."
            text = json.dumps(doc, sort_keys=True)
        return text

    @classmethod
    def latest(cls, causes: list[str]) -> HangEnd | None:
        """The newest hang record among ``step_end`` causes (a fault's is plain text)."""
        for text in reversed(causes):
            if (found := cls.from_json(text)) is not None:
                return found
        return None

    @classmethod
    def from_json(cls, text: str) -> HangEnd | None:
        """The record, or None for "" (no hang ended the step) or a record this version
        cannot read: then the step's failure is judged as if no hang had ended it."""
        if not text.startswith("{"):
            return None
        try:
            d = json.loads(text)
            return cls(
                str(d["cause"]),
                int(d["step"]),
                tuple(str(n) for n in d["suspects"]),
                tuple(str(n) for n in d["shown"]),
                bool(d["clear"]),
            )
        except (ValueError, KeyError, TypeError):
            return None
