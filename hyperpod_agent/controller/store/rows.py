"""Plain rows read from and written to the controller's store."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class FaultIn:
    """A fault as the policy derives it from a report (before it has an id)."""

    component: str
    code: str
    severity: str
    action: str
    urgent: bool
    message: str = ""
    probe: str = ""  # the probe that reported it ("" when not known)


@dataclass(frozen=True)
class FaultRow:
    COLUMNS: ClassVar[str] = (
        "id, node, component, code, severity, action, urgent, first_seen, last_seen, "
        "count, message, closed_at, probe"
    )
    id: int
    node: str
    component: str
    code: str
    severity: str
    action: str
    urgent: bool
    first_seen: float
    last_seen: float
    count: int
    message: str
    closed_at: float | None
    probe: str = ""

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> FaultRow:
        return cls(
            int(r[0]),
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            bool(r[6]),
            float(r[7]),
            float(r[8]),
            int(r[9]),
            r[10],
            None if r[11] is None else float(r[11]),
            r[12] or "",
        )


@dataclass(frozen=True)
class NodeRow:
    COLUMNS: ClassVar[str] = (
        "name, agent_id, seq, generated_at, received_at, verdict, report, "
        "hb_agent_id, hb_seq, heartbeat_at, jobs_opted_in, progress"
    )
    name: str
    agent_id: str | None
    seq: int | None
    generated_at: float | None
    received_at: float | None
    verdict: str | None
    report: str | None
    hb_agent_id: str | None
    hb_seq: int | None
    heartbeat_at: float | None
    jobs_opted_in: str = "{}"
    progress: str = "[]"  # the report's progress list, JSON

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> NodeRow:
        return cls(*r)

    def opted_in(self) -> dict[int, int]:
        """job id -> --auto-resume cap, as the agent saw it on the node."""
        if not self.jobs_opted_in or self.jobs_opted_in == "{}":
            return {}
        value = json.loads(self.jobs_opted_in)
        return {int(k): int(v) for k, v in value.items()} if isinstance(value, dict) else {}

    def report_dict(self) -> dict[str, Any] | None:
        if not self.report:
            return None
        value = json.loads(self.report)
        return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class ActionRow:
    COLUMNS: ClassVar[str] = (
        "id, kind, node, job_id, reason, cause, params, state, attempts, created_at, "
        "updated_at, next_attempt_at, error"
    )
    id: int
    kind: str
    node: str | None
    job_id: int | None
    reason: str
    cause: str
    params: dict[str, Any]
    state: str  # intent | applied | done | failed | abandoned
    attempts: int
    created_at: float
    updated_at: float
    next_attempt_at: float
    error: str

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> ActionRow:
        params = json.loads(r[6]) if r[6] else {}
        return cls(
            int(r[0]),
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            params,
            r[7],
            int(r[8]),
            float(r[9]),
            float(r[10]),
            float(r[11]),
            r[12],
        )


@dataclass(frozen=True)
class TrackedJob:
    """An auto-resume job the controller looks after."""

    COLUMNS: ClassVar[str] = (
        "job_id, cap, attempts, last_cause, state, last_requeue_at, acted_restart_count, "
        "resumed_from_step, updated_at"
    )
    job_id: int
    cap: int
    attempts: int = 0
    last_cause: str = ""
    state: str = "tracked"  # tracked | requeued | failed | exhausted | done
    last_requeue_at: float | None = None
    acted_restart_count: int | None = None
    resumed_from_step: int | None = None
    updated_at: float = 0.0

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> TrackedJob:
        return cls(int(r[0]), int(r[1]), int(r[2]), r[3], r[4], r[5], r[6], r[7], float(r[8]))

    def to_row(self) -> tuple[Any, ...]:
        return (
            self.job_id,
            self.cap,
            self.attempts,
            self.last_cause,
            self.state,
            self.last_requeue_at,
            self.acted_restart_count,
            self.resumed_from_step,
            self.updated_at,
        )


@dataclass(frozen=True)
class FindingRow:
    """A hang or a straggler, declared once per job run (and step, or node)."""

    COLUMNS: ClassVar[str] = "id, kind, job_id, restart_count, node, step, detail, at"
    id: int
    kind: str  # hang | straggler
    job_id: int
    restart_count: int
    node: str  # the straggler; '' for a hang
    step: int  # the step a hang stopped at; -1 for a straggler
    detail: str
    at: float

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> FindingRow:
        return cls(int(r[0]), r[1], int(r[2]), int(r[3]), r[4], int(r[5]), r[6], float(r[7]))

    @property
    def key(self) -> tuple[str, int, int, str, int]:
        return (self.kind, self.job_id, self.restart_count, self.node, self.step)


@dataclass(frozen=True)
class EventIn:
    """An event to record (it gets its id and time from the store)."""

    kind: str
    message: str
    node: str | None = None
    job_id: int | None = None
    cause: str = ""


@dataclass(frozen=True)
class EventRow:
    COLUMNS: ClassVar[str] = "id, at, kind, node, job_id, cause, message"
    id: int
    at: float
    kind: str
    node: str | None
    job_id: int | None
    cause: str
    message: str

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> EventRow:
        return cls(int(r[0]), float(r[1]), r[2], r[3], r[4], r[5], r[6])
