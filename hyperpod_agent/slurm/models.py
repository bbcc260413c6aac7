"""What the rest of the project knows about Slurm nodes and jobs.

Plain frozen dataclasses: the parsers build them, everybody else reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Node:
    name: str
    state: str  # base state, upper case: IDLE, MIXED, ALLOCATED, DOWN, FUTURE, ...
    flags: frozenset[str] = frozenset()  # DRAIN, NOT_RESPONDING, REBOOT_REQUESTED, ...
    reason: str = ""
    reason_user: str = ""
    reason_time: datetime | None = None
    partitions: tuple[str, ...] = ()
    address: str = ""
    port: int | None = None
    boot_time: datetime | None = None
    slurmd_start_time: datetime | None = None

    @property
    def drained(self) -> bool:
        """Kept out of scheduling: DRAIN (draining or drained), DOWN or FAIL."""
        return "DRAIN" in self.flags or self.state in ("DOWN", "FAIL") or "FAIL" in self.flags

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags and self.state != "DOWN"


# Job states after which a job holds no node and runs nothing.
ENDED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
     "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)  # fmt: skip


@dataclass(frozen=True)
class Job:
    job_id: int
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, NODE_FAIL, CANCELLED, ...
    state_reason: str = ""
    nodes: tuple[str, ...] = ()
    restart_count: int = 0
    auto_resume: int | None = None  # the --auto-resume=N cap, None when not opted in
    admin_comment: str = ""
    exit_code: int | None = None
    requeue: bool = False
    batch_host: str = ""
    user: str = ""
    uid: int | None = None  # the owner's uid (a step may only speak for its own job)
    partition: str = ""
    start_time: datetime | None = None
    end_time: datetime | None = None
    extra: dict[str, str] = field(default_factory=dict)
