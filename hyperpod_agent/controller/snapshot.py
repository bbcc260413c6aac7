"""What the pure policy sees and what it returns (no I/O here)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hyperpod_agent.controller.store.checks import NodeOutcome
from hyperpod_agent.controller.store.rows import ActionRow, FaultRow, FindingRow, TrackedJob
from hyperpod_agent.health import JobProgress, Verdict
from hyperpod_agent.slurm.models import Job, Node


class Kind(enum.StrEnum):
    """Things the executor can do. ``exhaust``, ``not_retried``, ``finding`` and
    ``step_end`` are bookkeeping only (no Slurm call)."""

    DRAIN = "drain"
    RESUME = "resume"
    REBOOT = "reboot"
    REPLACE = "replace"
    HOLD = "hold"
    REQUEUE = "requeue"
    EXHAUST = "exhaust"
    NOT_RETRIED = "not_retried"
    CANCEL = "cancel"  # a hung job that is not auto-resume, when configured
    FINDING = "finding"  # a hang or straggler declared (params: the finding)
    CHECK = "check"  # a deep-check run planned (params: nodes, level, purpose, prior)
    # a hung job's watched step told to end, for its retry in place (params: the hang)
    STEP_END = "step_end"


NODE_KINDS = (Kind.DRAIN, Kind.RESUME, Kind.REBOOT, Kind.REPLACE, Kind.HOLD)


@dataclass(frozen=True)
class NodeHealth:
    """The controller's view of one agent."""

    verdict: Verdict | None = None
    generated_at: float | None = None  # latest report, agent clock
    last_seen: float | None = None  # latest report or heartbeat, controller clock
    jobs_opted_in: Mapping[int, int] = field(default_factory=dict)
    progress: Sequence[JobProgress] = ()  # the training ranks on the node, latest report


def speaks_for(job: Job, node: str, progress: JobProgress) -> bool:
    """A node's progress record counts for ``job``: reported from a node the job runs
    on, and checked by the agent against the job's user (``progress.uid``) when Slurm
    names one. Another user's files, or an old agent's unchecked ones, never do."""
    if node not in job.nodes:
        return False
    return job.uid is None or progress.uid == job.uid


@dataclass(frozen=True)
class Snapshot:
    """Everything one reconcile pass knows. Times are epoch seconds."""

    nodes: Mapping[str, Node]
    jobs: Sequence[Job] = ()
    health: Mapping[str, NodeHealth] = field(default_factory=dict)
    open_faults: Sequence[FaultRow] = ()
    history: Sequence[FaultRow] = ()  # faults first seen within the longest window
    # Closed faults that share a code and the shared-cause window with an open one: a
    # burst stays a burst after the node acted on first came back clean.
    burst_peers: Sequence[FaultRow] = ()
    findings: Sequence[FindingRow] = ()  # hangs and stragglers within the lemon window
    in_flight: Sequence[ActionRow] = ()  # actions in state intent/applied
    done: Sequence[ActionRow] = ()  # completed actions within the escalation window
    tracked: Mapping[int, TrackedJob] = field(default_factory=dict)
    requeues_last_minute: int = 0
    started_at: float = 0.0
    # Why no running job may be expanded on this slurmctld ("" when allowed): a step
    # retry in place is then answered with the job-level requeue (slurm/version.py).
    expansion_refused: str = ""
    # Nodes held for repair whose replacement came into service: no longer capacity lost.
    replaced: frozenset[str] = frozenset()
    # Deep checks: each node's newest outcome, and the nodes a run is under way on.
    check_outcomes: Mapping[str, NodeOutcome] = field(default_factory=dict)
    checking: frozenset[str] = frozenset()
    # Step retries under way: job id -> (the node taken out, the spare going in). The
    # policy leaves these jobs and nodes to the surgery (stepretry/run.py).
    step_retries: Mapping[int, tuple[str, str]] = field(default_factory=dict)
    # Jobs whose step a step-retry helper watches: job id -> when it was first told to
    # end its step (None: not yet). See ``left_to_step_retry``.
    watched_jobs: Mapping[int, float | None] = field(default_factory=dict)
    # The same jobs: when the oldest launch under watch began. A step retried in place
    # runs in the same job: its ranks' progress from before then is the launch before's.
    watch_launched: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PlannedAction:
    kind: Kind
    node: str | None
    reason: str
    cause: str
    job_id: int | None = None
    urgent: bool = False
    takes_out: bool = False  # takes an in-service node out (counts toward blast radius)
    admin: bool = False  # requested by a human: exempt from incident mode
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PlannedEvent:
    kind: str
    message: str
    node: str | None = None
    job_id: int | None = None
    cause: str = ""


@dataclass(frozen=True)
class Decision:
    actions: list[PlannedAction] = field(default_factory=list)
    events: list[PlannedEvent] = field(default_factory=list)
    incident: bool = False
    incident_reason: str = ""
    hung_jobs: int = 0  # running jobs past their hang limit (declared or not)


# How long a watched job's step may take, once told to end, to ask for its retry: after
# that the watch protects nothing and today's recovery (replace, requeue) acts.
WATCH_GRACE_S = 60.0


def retrying_in_place(snap: Snapshot, now: float) -> set[int]:
    """Jobs whose step is being retried in place: a surgery is under way, or the step
    was told to end (and its next launch has not renewed the watch yet). No rank of
    theirs advances meanwhile, by design."""
    jobs = set(snap.step_retries)
    live = _running(snap)
    jobs |= {
        j
        for j, end_at in snap.watched_jobs.items()
        if end_at is not None and now - end_at < WATCH_GRACE_S and j in live
    }
    return jobs


def left_to_step_retry(snap: Snapshot, now: float) -> set[int]:
    """Jobs whose node faults the policy leaves alone: retrying in place, or a watched
    step still running that will ask for its retry if a fault ends it. A watch shields
    only a job Slurm shows running: once it ended, its nodes may hold other users' jobs."""
    live = _running(snap)
    watched = {j for j, end_at in snap.watched_jobs.items() if end_at is None and j in live}
    return retrying_in_place(snap, now) | watched


def _running(snap: Snapshot) -> set[int]:
    return {j.job_id for j in snap.jobs if j.state.upper() == "RUNNING"}
