"""The evidence of a chaos campaign, as records (bench/chaos_parse.py makes them from text).

The checker (bench/chaos_check.py) reads only what the product does not control: Slurm's
own views (``scontrol show node|job|res -o``, slurmctld's log), what the driver did and
saw (injections, the admin's actions, process samples, job output files) and, to be
checked against those, the product's event log and status. Nothing here imports the
product's controller or its Slurm parsers: those are what is being checked. Every time
is seconds since the epoch, taken by the driver (``t``) or printed by Slurm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PRODUCT_PREFIX = "hyperpod:"
SPARE_REASON = "hyperpod:spare"
# The flags and base states under which a node runs no new job.
OUT_FLAGS = frozenset({"DRAIN", "FAIL", "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWERED_DOWN"})
OUT_STATES = frozenset({"DOWN", "FUTURE"})
ENDED_JOB_STATES = frozenset(
    "COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY PREEMPTED BOOT_FAIL "
    "DEADLINE".split()
)


class EvidenceError(ValueError):
    """Raw evidence that does not parse: the campaign's record is broken, not the product."""


@dataclass(frozen=True)
class NodeSample:
    """One node in one ``scontrol show node -o`` sweep taken at ``t``."""

    t: float
    node: str
    state: str  # the base state: IDLE, MIXED, ALLOCATED, DOWN, ...
    flags: frozenset[str]  # DRAIN, FAIL, NOT_RESPONDING, REBOOT_REQUESTED, ...
    reason: str = ""  # without Slurm's ``[user@time]`` tail
    reason_user: str = ""

    @property
    def out(self) -> bool:
        """Out of service: no new job may start on it."""
        return self.state in OUT_STATES or bool(self.flags & OUT_FLAGS)

    @property
    def ours(self) -> bool:
        """The reason is the product's (the spare pool's included)."""
        return self.reason.startswith(PRODUCT_PREFIX)

    @property
    def spare(self) -> bool:
        return self.reason == SPARE_REASON

    def show(self) -> str:
        state = "+".join([self.state, *sorted(self.flags)])
        return f"{self.node} {state} reason={self.reason!r}" + (
            f" by {self.reason_user}" if self.reason_user else ""
        )


@dataclass(frozen=True)
class JobSample:
    """One job in one ``scontrol show job -o`` sweep taken at ``t``."""

    t: float
    job_id: int
    name: str
    state: str
    restarts: int
    nodes: tuple[str, ...] = ()
    exit_code: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED_JOB_STATES


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: tuple[str, ...]
    flags: str = ""
    users: str = ""


@dataclass(frozen=True)
class ReservationSweep:
    """Every reservation ``scontrol show res -o`` listed at ``t`` (a sweep may hold none,
    so reservations come per sweep, not per record)."""

    t: float
    reservations: tuple[Reservation, ...]


@dataclass(frozen=True)
class CtldLine:
    t: float
    text: str


@dataclass(frozen=True)
class CtldAction:
    """A change slurmctld logged: ``verb`` is ``reason`` / ``state`` (update_node),
    ``reboot``, ``requeue`` (a request), ``slurm_requeue`` (Slurm's own, a node failed);
    ``target`` a node name or a job id."""

    t: float
    verb: str
    target: str
    detail: str = ""


@dataclass(frozen=True)
class Injection:
    """A fault the driver injected: ``target`` a node, a job id or a controller id."""

    t: float
    kind: str
    target: str
    heal_at: float | None = None


@dataclass(frozen=True)
class AdminAction:
    """What the driver did as the site's admin, and how long that state holds.

    ``kind``: ``drain`` (with the admin's own ``reason``), ``resume``, ``reserve``
    (``reservation`` names it) or ``reboot``. ``start``: when the admin's command returned;
    ``end``: when the admin undid it (None: never, during the campaign)."""

    kind: str
    node: str
    start: float
    end: float | None = None
    reason: str = ""
    reservation: str = ""

    def holds_at(self, t: float) -> bool:
        return t > self.start and (self.end is None or t < self.end)


@dataclass(frozen=True)
class ProcessSample:
    """One controller process as the driver saw it (``leader_claimed``: its own
    ``GET /v1/status`` said ``role == "leader"``; None when it did not answer)."""

    t: float
    controller_id: str
    pid: int
    alive: bool
    leader_claimed: bool | None = None


@dataclass(frozen=True)
class Event:
    """One event of ``hyperpod events --json`` (the product's claim, to be checked)."""

    id: int
    at: float
    kind: str
    node: str | None
    job_id: int | None
    cause: str = ""
    message: str = ""

    def names_node(self, node: str) -> bool:
        if self.node == node:
            return True
        return re.search(rf"(?<![\w.-]){re.escape(node)}(?![\w-])", self.message) is not None

    def names_job(self, job_id: int) -> bool:
        return self.job_id == job_id or re.search(rf"\bjob {job_id}\b", self.message) is not None


@dataclass(frozen=True)
class StatusSample:
    """``hyperpod status --json`` of the leading controller, taken at ``t``."""

    t: float
    leader: str | None
    last_pass_at: float | None


@dataclass(frozen=True)
class Attempt:
    """One run of a training job, from its ``attempt K on NODES at T`` line on.

    ``start_step``: None when it died before saying, 0 for a fresh start, N for
    ``resume step=N`` (the checkpoint's step; the next step is N + 1)."""

    number: int
    nodes: str
    started_at: float
    start_step: int | None
    steps: tuple[tuple[int, float], ...]
    last_at: float  # its last line


@dataclass(frozen=True)
class TrainOutput:
    attempts: tuple[Attempt, ...]
    done_step: int | None

    @property
    def steps(self) -> list[int]:
        return [s for a in self.attempts for s, _ in a.steps]


@dataclass(frozen=True)
class Recovery:
    """One fault's recovery as the driver measured it (None: never running again)."""

    kind: str
    fault_at: float
    running_at: float | None


@dataclass(frozen=True)
class Violation:
    invariant: str
    when: float
    evidence: str
