"""The shared vocabulary: probe status, actions, faults and node verdicts.

Every component (probes, agent, controller, CLI) speaks these words; nothing else
defines them.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hyperpod_agent.wire import Tolerant


class Status(str, enum.Enum):
    """Outcome of one probe run. UNKNOWN means the checking machinery failed,
    never that the node is sick: it must not lead to a drain."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"


class Action(str, enum.Enum):
    """What a fault asks for, mildest first (see ``ACTION_ORDER``)."""

    NONE = "NONE"
    MONITOR = "MONITOR"  # recorded, the node stays in service
    # Out of service until healthy again, and nothing more: for faults a reboot cannot
    # mend (a disk users filled). Never escalated, never a lemon's sign.
    DRAIN = "DRAIN"
    RESET = "RESET"
    REBOOT = "REBOOT"
    REPLACE = "REPLACE"

    @property
    def rank(self) -> int:
        return ACTION_ORDER.index(self)

    @property
    def takes_out(self) -> bool:
        """Does the fault ask for the node to leave service (DRAIN or stronger)?"""
        return self.rank >= Action.DRAIN.rank

    def escalate(self) -> Action:
        """The next stronger remediation (RESET -> REBOOT -> REPLACE). NONE, MONITOR and
        DRAIN stay what they are: a repeat of a drain-only fault needs no stronger remedy."""
        if self in (Action.NONE, Action.MONITOR, Action.DRAIN):
            return self
        return ACTION_ORDER[min(self.rank + 1, len(ACTION_ORDER) - 1)]


ACTION_ORDER: list[Action] = [
    Action.NONE,
    Action.MONITOR,
    Action.DRAIN,
    Action.RESET,
    Action.REBOOT,
    Action.REPLACE,
]


def strongest(actions: list[Action]) -> Action:
    """The strongest action of a list (NONE for an empty one)."""
    return max(actions, key=lambda a: a.rank, default=Action.NONE)


class Verdict(str, enum.Enum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    FAULTY = "faulty"


class Finding(Tolerant):
    """One thing a probe found wrong with one component."""

    model_config = ConfigDict(frozen=True)

    component: str = Field(min_length=1, max_length=64, description="gpu3, ib0, /scratch, slurmd")
    code: str = Field(min_length=1, max_length=64, description="xid79, link_down, fs_readonly")
    status: Status
    action: Action = Action.NONE
    urgent: bool = False
    message: str = Field(default="", max_length=512)


class ProbeResult(Tolerant):
    """What one probe reported in one run."""

    model_config = ConfigDict(frozen=True)

    probe: str = Field(min_length=1, max_length=32)
    status: Status
    message: str = Field(default="", max_length=1024)
    findings: list[Finding] = Field(default_factory=list)
    duration_s: float = 0.0
    at: datetime


class Fault(BaseModel):
    """A finding the controller tracks on a node over time."""

    model_config = ConfigDict(extra="forbid")

    node: str
    component: str
    code: str
    severity: Status
    action: Action
    urgent: bool = False
    first_seen: datetime
    last_seen: datetime
    count: int = 1
    message: str = ""


class FaultRef(Tolerant):
    """A FAIL finding the agent's verdict confirmed: reported by enough consecutive runs
    of its probe (flap damping) and outside the start-up grace. Only these may lead the
    controller to take the node out."""

    model_config = ConfigDict(frozen=True)

    probe: str = Field(min_length=1, max_length=32)
    component: str = Field(min_length=1, max_length=64)
    code: str = Field(min_length=1, max_length=64)


MAX_JOB_ID = 2**32 - 1  # Slurm job ids are 32-bit
MAX_ATTEMPTS = 100_000  # what an --auto-resume marker may say; the controller caps lower


def _seconds() -> Any:
    """A step duration: optional, bounded."""
    return Field(default=None, ge=0.0, le=1e7)


class RankProgress(Tolerant):
    """One training rank's progress on this node, summarised by the agent."""

    model_config = ConfigDict(frozen=True)

    rank: int = Field(ge=0, le=10_000_000)
    pid: int = Field(ge=0, le=2**31)
    step: int = Field(ge=-1, le=2**62, description="the last finished step; -1 none yet")
    step_at: float | None = Field(default=None, ge=0, description="epoch s, node clock")
    paused: bool = False
    pause_reason: str = Field(default="", max_length=56)
    pause_since: float | None = Field(default=None, ge=0)
    window: int = Field(default=0, ge=0, le=1024, description="step durations summarised")
    # median_s: of the rank's compute times when it records them (progress.step's
    # compute_s), else of its step durations; the straggler judgement reads it. p95_s
    # and last_s are always step durations (the hang judgement reads p95_s).
    median_s: float | None = _seconds()
    p95_s: float | None = _seconds()
    last_s: float | None = _seconds()
    proc_state: str = Field(
        default="", max_length=8, description="the process's state letter; 'gone' if it exited"
    )


class JobProgress(Tolerant):
    """The progress of one job's ranks on this node."""

    model_config = ConfigDict(frozen=True)

    job_id: int = Field(gt=0, le=MAX_JOB_ID)
    uid: int | None = Field(
        default=None,
        ge=0,
        le=2**32 - 1,
        description="the user the agent checked the records against: they are that uid's "
        "files, written by processes of the job running as it (None: not checked, an older "
        "agent); the controller compares it with the job's user in Slurm",
    )
    hang_factor: float | None = Field(default=None, gt=0.0, le=1000.0)
    hang_min_s: float | None = Field(default=None, gt=0.0, le=1e7)
    ranks: list[RankProgress] = Field(default_factory=list, max_length=256)


class NodeReport(Tolerant):
    """What an agent tells the controller, and what it caches for health-check.

    ``seq`` grows by one per report from an agent process; ``agent_id`` changes when
    the agent restarts, so (agent_id, seq) orders reports and exposes replays.
    A newer agent's fields this release does not know are ignored and counted
    (``wire.Tolerant``).
    """

    node: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    agent_id: str = Field(min_length=1, max_length=64)
    seq: int = Field(ge=0)
    generated_at: datetime
    verdict: Verdict
    action: Action = Action.NONE
    urgent: bool = False
    message: str = Field(default="", max_length=1024)
    results: list[ProbeResult] = Field(default_factory=list, max_length=64)
    confirmed: list[FaultRef] = Field(
        default_factory=list,
        max_length=256,
        description="the FAIL findings the verdict confirmed (damped, outside grace)",
    )
    jobs_opted_in: dict[int, int] = Field(
        default_factory=dict,
        max_length=1024,
        description="job id -> --auto-resume cap seen on this node (srun markers)",
    )
    progress: list[JobProgress] = Field(
        default_factory=list,
        max_length=64,
        description="training progress of the jobs on this node (progress records)",
    )

    @field_validator("jobs_opted_in")
    @classmethod
    def _bounded_jobs(cls, value: dict[int, int]) -> dict[int, int]:
        for job_id, cap in value.items():
            if not 0 < job_id <= MAX_JOB_ID:
                raise ValueError(f"job id {job_id} outside 1..{MAX_JOB_ID}")
            if not 0 <= cap <= MAX_ATTEMPTS:
                raise ValueError(f"job {job_id}: cap {cap} outside 0..{MAX_ATTEMPTS}")
        return value
