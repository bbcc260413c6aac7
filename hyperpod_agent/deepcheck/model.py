"""What a deep check says: one result per check, one suite result per run.

A check's outcome is OK, FAIL or UNKNOWN. UNKNOWN means the checking machinery could
not tell (binary missing, time limit, output we could not read): it keeps a node out of
service like a FAIL would, but it must never be taken as evidence that the hardware is
broken, so callers tell the two apart.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

CAUSE_CHARS = 300


class CheckOutcome(str, enum.Enum):
    OK = "OK"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"


# exit codes of ``python -m hyperpod_agent.deepcheck run`` by gating outcome; 2 is taken
# by usage and configuration errors
EXIT_CODES: dict[CheckOutcome, int] = {
    CheckOutcome.OK: 0,
    CheckOutcome.FAIL: 1,
    CheckOutcome.UNKNOWN: 3,
}


def one_line(text: str, limit: int = CAUSE_CHARS) -> str:
    """``text`` with every run of whitespace made one space, cut to ``limit`` chars."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass(frozen=True)
class Judgement:
    """What a parser's judge concludes from one tool's output (pure data)."""

    outcome: CheckOutcome
    cause: str
    figures: dict[str, float] = field(default_factory=dict)


class CheckResult(BaseModel):
    """One check on one node (or pair of nodes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    check: str = Field(min_length=1, max_length=64)
    kind: str
    outcome: CheckOutcome
    cause: str = Field(max_length=CAUSE_CHARS)
    figures: dict[str, float] = Field(default_factory=dict)
    duration_s: float = Field(ge=0)
    nodes: list[str]
    gating: bool
    command: list[str] = Field(default_factory=list)


class SuiteResult(BaseModel):
    """A run of one level of a suite. ``outcome`` is the gating outcome: FAIL when a
    gating check failed, else UNKNOWN when one could not tell, else OK."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    level: str
    nodes: list[str]
    started_at: datetime
    duration_s: float = Field(ge=0)
    outcome: CheckOutcome
    results: list[CheckResult]
    skipped: list[str] = Field(
        default_factory=list, description="checks not run because a gating check failed"
    )

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]


def gating_outcome(results: list[CheckResult]) -> CheckOutcome:
    """FAIL beats UNKNOWN beats OK, over the gating checks only."""
    gating = {r.outcome for r in results if r.gating}
    for outcome in (CheckOutcome.FAIL, CheckOutcome.UNKNOWN):
        if outcome in gating:
            return outcome
    return CheckOutcome.OK
