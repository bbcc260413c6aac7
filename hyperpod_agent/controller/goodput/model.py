"""What the goodput computation reads (plain records) and what it answers (the API's
models). Times in the records are epoch seconds; in the answers, UTC datetimes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field

# Where lost time goes, in the order a recovery runs through it; then what a running job
# loses without a fault. ``detection``: the fault reported -> the controller's first
# action; ``drain``: -> the bad node out; ``shrink``: -> the job shrunk to its good nodes
# (step retry); ``spare_in``: -> a spare merged into the job (step retry); ``requeue``:
# -> the job requeued (job-level); ``queue_wait``: requeued -> running again (Slurm's start
# of the next run); ``restart``: -> the first new step (start-up, restore); ``recompute``:
# steps run a second time since the last checkpoint; ``checkpoint``: ranks paused in a
# checkpoint save.
CAUSES = (
    "detection",
    "drain",
    "shrink",
    "spare_in",
    "requeue",
    "queue_wait",
    "restart",
    "recompute",
    "checkpoint",
)
PRODUCTIVE = "productive"
UNACCOUNTED = "unaccounted"  # time the records do not tell the use of
RecoveryPath = Literal["step_retry", "requeue"]
# A recovery's points, in the order they happen, and the phase the time up to each one is
# lost to. ``fault``: the fault event (or a hang's start); ``acted``: the controller's first
# action (a step told to end, a retry or requeue decided, a node taken out); ``restored``:
# the job's resume marker read (it restored a checkpoint).
POINTS = (
    "fault",
    "acted",
    "drained",
    "shrunk",
    "spare_in",
    "requeued",
    "running_again",
    "restored",
    "first_new_step",
)
PHASE_ENDING_AT = {
    "acted": "detection",
    "drained": "drain",
    "shrunk": "shrink",
    "spare_in": "spare_in",
    "requeued": "requeue",
    "running_again": "queue_wait",
    "restored": "restart",
    "first_new_step": "restart",
}


@dataclass(frozen=True)
class JobRecord:
    """A job as Slurm and the controller's own records show it."""

    job_id: int
    state: str | None = None  # Slurm's state now (upper case); None: Slurm no longer shows it
    started_at: float | None = None  # the current run's start (Slurm keeps no earlier one)
    ended_at: float | None = None
    # Every node the job is known to have held: now, and before each requeue.
    nodes: frozenset[str] = frozenset()
    node_count: int = 0  # nodes it holds now (0: not known)


@dataclass(frozen=True)
class ProgressMark:
    """One rank's progress record as the controller saw it at ``seen_at``."""

    job_id: int
    rank: int
    seen_at: float
    step: int  # the last finished step; -1: none yet
    step_at: float | None = None  # when it finished (the node's clock)
    paused: bool = False
    pause_reason: str = ""
    # While paused: when the paused phase began; else when the last one ended.
    pause_since: float | None = None
    step_s: float | None = None  # the duration of its latest step


def at(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


class Lost(BaseModel):
    """Time lost to one cause. ``seconds`` None: the records do not tell it (``why``
    says what is missing); ``complete`` false: at least this much (``why`` says what
    may be missing)."""

    seconds: float | None
    complete: bool = True
    why: str = ""


class IncidentGoodput(BaseModel):
    """One recovery of the job: its points in time and what each phase took."""

    started_at: datetime
    path: RecoveryPath | None = Field(description="step_retry or requeue; None: neither recorded")
    node: str | None = Field(description="the node the fault was on, when recorded")
    cause: str
    points: dict[str, datetime | None]
    phases: dict[str, Lost]
    recomputed_steps: int | None
    ongoing: bool


class JobGoodput(BaseModel):
    """A job's wall time in the window, shared out: productive + lost + unaccounted."""

    job_id: int
    state: str | None
    nodes: int = Field(description="nodes the job holds now, the weight of its time")
    start: datetime | None = Field(description="the window's start for this job")
    end: datetime | None
    wall_s: float
    productive_s: float
    unaccounted_s: float = Field(description="time the records do not tell the use of")
    ettr: float | None = Field(description="productive / wall; None without wall time")
    lost: dict[str, Lost]
    incidents: list[IncidentGoodput]
    limits: list[str] = Field(default_factory=list)


class ClusterGoodput(BaseModel):
    """Every job the controller looks after, weighted by its nodes (node-seconds)."""

    since: datetime | None
    until: datetime
    jobs_counted: int
    wall_node_s: float
    productive_node_s: float
    unaccounted_node_s: float
    ettr: float | None
    lost_node_s: dict[str, Lost]
    jobs: list[JobGoodput]
    limits: list[str] = Field(default_factory=list)
