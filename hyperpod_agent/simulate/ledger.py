"""Where the job's time went: kept progress, and what was lost, by phase and by cause.

Every second of the job's wall time is in exactly one bucket: kept (progress that
survives), or lost in one phase (detection, waiting, restart, recompute, checkpoint),
and each lost second has one cause (a fault category, or ``checkpointing``). ETTR is
kept over wall time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from hyperpod_agent.simulate.causes import CHECKPOINTING

PHASES = ("detection", "waiting", "restart", "recompute", "checkpoint")


@dataclass(frozen=True)
class Incident:
    """One fault that interrupted the job."""

    at: float  # seconds from the start
    node: str
    fault: str  # the fault class
    category: str
    outcome: str  # what recovered it: step_retry, requeue, resubmit, ...
    down_s: float  # fault -> productive again
    recompute_s: float  # progress lost with it


@dataclass
class Ledger:
    """Accumulates the job's time; ``close`` checks that the buckets add up."""

    kept: float = 0.0
    by_phase: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_cause: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    incidents: list[Incident] = field(default_factory=list)

    def lose(self, phase: str, cause: str, seconds: float) -> None:
        if seconds <= 0:
            return
        self.by_phase[phase] += seconds
        self.by_cause[cause] += seconds

    def run(self, seconds: float, interval: float, block: float, cause: str | None) -> float:
        """A stretch of ``seconds`` running, saving every ``interval`` of compute at a
        cost of ``block``; ended by a fault of ``cause`` (its unsaved progress lost) or by
        the end of the simulation (None: kept). Returns the progress lost."""
        if seconds <= 0:
            return 0.0
        cycle = interval + block
        saves = int(seconds // cycle)
        rest = seconds - saves * cycle
        self.kept += saves * interval
        self.lose("checkpoint", CHECKPOINTING, saves * block)
        if cause is None:
            # the end of the horizon: what is unsaved would be saved next; count it kept
            self.kept += min(rest, interval)
            self.lose("checkpoint", CHECKPOINTING, max(0.0, rest - interval))
            return 0.0
        self.lose("recompute", cause, rest)
        return rest

    @property
    def lost(self) -> float:
        return sum(self.by_phase.values())
