"""Request and response bodies of the controller API (``/v1``)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from hyperpod_agent.controller.goodput import JobGoodput
from hyperpod_agent.wire import Tolerant

NODE_PATTERN = r"^[A-Za-z0-9._-]+$"
NODE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

# Every error code the API answers with, and its HTTP status (docs/controller.md lists
# them all; a test checks both ways).
ERROR_CODES: dict[str, int] = {
    "bad_request": 400,
    "malformed_json": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "replayed": 409,
    "stale": 409,
    "from_future": 409,
    "no_replacement": 409,
    "not_configured": 409,
    "bad_suite": 409,
    "busy": 409,
    "not_responding": 409,
    "in_use": 409,
    "too_large": 413,
    "unsupported_media_type": 415,
    "invalid": 422,
    "rate_limited": 429,
    "headers_too_large": 431,
    "internal": 500,
    "auth_unavailable": 503,
    "slurm_unavailable": 503,
    "not_leader": 503,
}


class HeartbeatIn(Tolerant):
    """Small "still alive" message an agent sends between reports."""

    node: str = Field(min_length=1, max_length=64, pattern=NODE_PATTERN)
    agent_id: str = Field(min_length=1, max_length=64)
    seq: int = Field(ge=0, le=2**63 - 1)
    sent_at: datetime


class AdminActionIn(Tolerant):
    """``POST /v1/nodes/{name}/actions``: a human asks for an action."""

    action: Literal["drain", "resume", "reboot", "replace"]
    reason: str = Field(default="", max_length=160)
    # resume only: false skips the deep check the re-entry gate would ask for first
    # (``hyperpod node resume --no-check``); absent, as an older client sends it: checked
    check: bool | None = None

    @model_validator(mode="after")
    def _check_is_for_resume(self) -> AdminActionIn:
        if self.check is not None and self.action != "resume":
            raise ValueError(f"check applies to resume only, not to {self.action}")
        return self


class JobEndedIn(Tolerant):
    """``POST /v1/jobs/{id}/ended``: EpilogSlurmctld says a job ended (all optional)."""

    exit_code: int | None = Field(default=None, ge=0, le=255)
    state: str | None = Field(default=None, max_length=32, pattern=r"^[A-Za-z_]*$")


class JobEndedOut(BaseModel):
    accepted: bool = True
    tracked: bool


class Accepted(BaseModel):
    accepted: bool = True
    open_faults: int | None = None


class ActionAccepted(BaseModel):
    action_id: int
    kind: str
    node: str
    reason: str
    dry_run: bool


class ErrorBody(BaseModel):
    code: str
    message: str
    details: list[dict[str, Any]] = Field(default_factory=list)


class ErrorOut(BaseModel):
    error: ErrorBody


class Status(BaseModel):
    nodes_total: int
    by_state: dict[str, int]
    by_verdict: dict[str, int]
    incident_mode: bool
    incident_reason: str
    dry_run: bool  # mode == "observe", for the CLIs that read this name
    mode: Literal["act", "observe"]
    version: str  # this controller's release
    api_version: int
    open_faults: int
    pending_actions: int
    last_pass_at: datetime | None
    leader: str | None = None
    leader_since: datetime | None = None
    this_controller: str
    role: Literal["leader", "standby", "single"]
    # items every pass skips since they kept failing (kind and id): the controller is degraded
    degraded: list[str] = Field(default_factory=list)
    # slurmctld's version, and why a step retry may not merge a spare into a job there
    # ("" when it may: slurm/version.py)
    slurmctld_version: str | None = None
    expansion_refused: str = ""


class NodeOut(BaseModel):
    name: str
    state: str | None = None
    flags: list[str] = Field(default_factory=list)
    reason: str = ""
    partitions: list[str] = Field(default_factory=list)
    verdict: str | None = None
    agent_id: str | None = None
    last_report_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    open_faults: int = 0
    agent_version: str | None = None  # the release its agent's requests name


class FaultOut(BaseModel):
    id: int
    component: str
    code: str
    severity: str
    action: str
    urgent: bool
    first_seen: datetime
    last_seen: datetime
    count: int
    message: str
    closed_at: datetime | None


class ActionOut(BaseModel):
    id: int
    kind: str
    node: str | None
    job_id: int | None
    reason: str
    cause: str
    state: Literal["intent", "applied", "done", "failed", "abandoned"] | str
    attempts: int
    created_at: datetime
    updated_at: datetime
    error: str


class FindingOut(BaseModel):
    """A hang or straggler the controller declared."""

    kind: str
    job_id: int
    restart_count: int
    node: str
    step: int
    at: datetime
    detail: str


class NodeDetail(NodeOut):
    faults: list[FaultOut] = Field(default_factory=list)
    deep_checks: list[CheckOutcomeOut] = Field(default_factory=list)
    findings: list[FindingOut] = Field(default_factory=list)
    actions: list[ActionOut] = Field(default_factory=list)
    report: dict[str, Any] | None = None


class JobOut(BaseModel):
    job_id: int
    state: str | None = None
    nodes: list[str] = Field(default_factory=list)
    restart_count: int | None = None
    cap: int
    attempts: int
    last_cause: str
    tracking: str
    last_requeue_at: datetime | None
    resumed_from_step: int | None
    findings: list[FindingOut] = Field(default_factory=list)
    step_retries: int = 0  # steps retried in place (done)
    last_step_retry: StepRetryOut | None = None


class EventOut(BaseModel):
    id: int
    at: datetime
    kind: str
    node: str | None
    job_id: int | None
    cause: str
    message: str


class JobDetail(JobOut):
    events: list[EventOut] = Field(default_factory=list)
    actions: list[ActionOut] = Field(default_factory=list)
    step_retry_history: list[StepRetryOut] = Field(default_factory=list)  # newest first
    goodput: JobGoodput | None = None  # as GET /v1/jobs/{id}/goodput answers


class CheckIn(Tolerant):
    """``POST /v1/checks``: an admin asks for a deep check of some nodes."""

    nodes: list[str] = Field(min_length=1, max_length=256)
    level: Literal["quick", "full"] = "quick"
    drain_first: bool = False

    @field_validator("nodes")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not NODE_NAME.match(name):
                raise ValueError(f"{name!r} is not a node name")
        if len(set(value)) != len(value):
            raise ValueError("a node is named twice")
        return value


class CheckOutcomeOut(BaseModel):
    run_id: int
    node: str
    purpose: str
    outcome: str
    check: str
    cause: str
    ran: bool
    at: datetime | None
    results: list[dict[str, Any]] = Field(default_factory=list)


class CheckRunOut(BaseModel):
    id: int
    nodes: list[str]
    level: str
    purpose: str
    phase: str
    job_id: int | None
    reservation: str
    requested_by: str
    created_at: datetime | None
    updated_at: datetime | None
    error: str
    outcomes: list[CheckOutcomeOut] = Field(default_factory=list)


# What a step's helper may still send for compatibility and the controller ignores: the
# step's nodes, its start and its budget are Slurm's and the job's own (docs/auto-resume.md).
# Checked for shape only, without expanding the list: nothing is worked out of a field
# before the controller knows the caller may ask about the job.
HOSTLIST_TEXT = r"^[A-Za-z0-9._,\[\]-]*$"


class StepFailureIn(Tolerant):
    """``POST /v1/steps/retry``: srun reports a failed ``--auto-resume`` step."""

    job_id: int = Field(ge=1, le=2**63 - 1)
    step_id: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9._-]+$")
    exit_code: int = Field(ge=0, le=255)
    attempt: int = Field(ge=1, le=1000, description="the attempt that failed; 1 = first launch")
    cancelled: bool = False
    nodelist: str = Field(
        default="",
        max_length=65536,
        pattern=HOSTLIST_TEXT,
        description="ignored: the step's nodes are what Slurm said when its watch began",
    )
    auto_resume: int = Field(
        default=0, ge=0, le=1000, description="ignored: the budget is the job's own opt-in"
    )
    started_at: datetime | None = Field(
        default=None, description="ignored: the step's start is its job's, as Slurm says"
    )


class StepWatchIn(Tolerant):
    """``POST /v1/steps/watch``: a step-retry helper's step is running (renewed every
    ``renew_every_s``)."""

    job_id: int = Field(ge=1, le=2**63 - 1)
    step_id: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9._-]+$")
    attempt: int = Field(ge=1, le=1000, description="this launch of the step; 1 = first")
    nodelist: str = Field(
        default="",
        max_length=65536,
        pattern=HOSTLIST_TEXT,
        description="ignored: the job's nodes are read from Slurm when the watch begins",
    )
    started_at: datetime | None = Field(
        default=None, description="ignored: the step's start is its job's, as Slurm says"
    )


class StepWatchOut(BaseModel):
    """Whether the step must end now (a node of it is faulty: its retry follows)."""

    end: bool
    cause: str
    renew_every_s: float


class StepRetryOut(BaseModel):
    """The answer to a failed step; for RETRYSTEP, the surgery's state. ``done`` says the
    answer is final: RETRYSTEP with the new node list, or REQUEUE after a rollback."""

    id: int | None  # the surgery's id (RETRYSTEP), None for an answer without one
    job_id: int
    step_id: str
    decision: Literal["RETRYSTEP", "REQUEUE", "FAIL"]
    cause: str
    phase: str | None
    done: bool
    attempt: int  # the attempt the relaunch will be
    nodelist: str = ""  # SLURM_JOB_NODELIST once done: the nodes the step runs on
    nnodes: int | None = None  # SLURM_NNODES once done
    # A node the job keeps that the step must not use (srun --exclude): a bad batch
    # host, which Slurm never removes from a running job.
    exclude: str = ""
    rdzv_host: str = ""  # HYPERPOD_RDZV_HOST: the first node of the new list
    retry_after_s: float = 0.0  # back-off before the relaunch (retries of the same step)
    created_at: datetime | None = None
    updated_at: datetime | None = None


# JobOut names StepRetryOut, defined after it.
JobOut.model_rebuild()
JobDetail.model_rebuild()


MAX_INT64 = 2**63 - 1  # SQLite's INTEGER
# Every error a route may answer, in the OpenAPI description
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut} for status in sorted(set(ERROR_CODES.values()))
}
