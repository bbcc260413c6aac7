"""The API's views of the controller's store rows (store/rows.py -> api/models.py), and
the parsing of the ``since`` query. Pure conversions, shared by every route of the API."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi.exceptions import RequestValidationError

from hyperpod_agent.controller.api.models import (
    ActionOut,
    CheckOutcomeOut,
    CheckRunOut,
    EventOut,
    FaultOut,
    FindingOut,
    StepRetryOut,
)
from hyperpod_agent.controller.store.checks import CheckRun, NodeOutcome
from hyperpod_agent.controller.store.rows import ActionRow, EventRow, FaultRow, FindingRow
from hyperpod_agent.controller.store.steps import StepRetry
from hyperpod_agent.slurm.hostlist import compress_hostlist, expand_hostlist


def at(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def ts(value: float | None) -> datetime | None:
    return None if value is None else at(value)


def fault_view(f: FaultRow) -> FaultOut:
    return FaultOut(
        id=f.id,
        component=f.component,
        code=f.code,
        severity=f.severity,
        action=f.action,
        urgent=f.urgent,
        first_seen=at(f.first_seen),
        last_seen=at(f.last_seen),
        count=f.count,
        message=f.message,
        closed_at=ts(f.closed_at),
    )


def finding_view(f: FindingRow) -> FindingOut:
    return FindingOut(
        kind=f.kind,
        job_id=f.job_id,
        restart_count=f.restart_count,
        node=f.node,
        step=f.step,
        at=at(f.at),
        detail=f.detail,
    )


def action_view(a: ActionRow) -> ActionOut:
    return ActionOut(
        id=a.id,
        kind=a.kind,
        node=a.node,
        job_id=a.job_id,
        reason=a.reason,
        cause=a.cause,
        state=a.state,
        attempts=a.attempts,
        created_at=at(a.created_at),
        updated_at=at(a.updated_at),
        error=a.error,
    )


def parse_since(value: str) -> tuple[int, float | None]:
    """``since`` as (event id, epoch seconds): a number is an id, else an ISO time."""
    if value.isascii() and value.isdigit():
        if int(value) > 2**62:
            raise invalid("since", "event id too large")
        return int(value), None
    return 0, iso_time(value, "since", "an event id or an ISO 8601 time")


def iso_time(value: str, name: str, expected: str = "an ISO 8601 time") -> float:
    """A query's ISO 8601 time (UTC when it names no zone) as epoch seconds; a 422 naming
    the query parameter ``name`` when it is not one."""
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise invalid(name, f"expected {expected}, got {value!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def invalid(name: str, message: str) -> RequestValidationError:
    """The API's 422 for a query parameter ``name`` that is not what it should be."""
    return RequestValidationError([{"loc": ("query", name), "msg": message, "type": "value_error"}])


def event_view(e: EventRow) -> EventOut:
    return EventOut(
        id=e.id,
        at=at(e.at),
        kind=e.kind,
        node=e.node,
        job_id=e.job_id,
        cause=e.cause,
        message=e.message,
    )


def outcome_view(o: NodeOutcome) -> CheckOutcomeOut:
    return CheckOutcomeOut(
        run_id=o.run_id,
        node=o.node,
        purpose=o.purpose,
        outcome=o.outcome,
        check=o.check,
        cause=o.cause,
        ran=o.ran,
        at=ts(o.at),
        results=o.detail,
    )


def run_view(run: CheckRun, outcomes: list[NodeOutcome]) -> CheckRunOut:
    return CheckRunOut(
        id=run.id,
        nodes=list(run.nodes),
        level=run.level,
        purpose=run.purpose,
        phase=run.phase,
        job_id=run.job_id,
        reservation=run.reservation,
        requested_by=run.requested_by,
        created_at=ts(run.created_at),
        updated_at=ts(run.updated_at),
        error=run.error,
        outcomes=[outcome_view(o) for o in outcomes],
    )


def step_retry_view(run: StepRetry, retry_after_s: float = 0.0) -> StepRetryOut:
    """A surgery as the failed step's helper polls it: RETRYSTEP until it failed."""
    done = run.phase in ("done", "failed")
    nodes = list(run.new_nodes) if run.phase == "done" else []
    # A bad batch host stays in the job (run.keep holds it): the step runs without it.
    parked = run.bad_node if nodes and run.bad_node in run.keep else ""
    nodes = [n for n in nodes if n != parked]
    nodelist = compress_hostlist(nodes) if nodes else ""
    return StepRetryOut(
        id=run.id,
        job_id=run.job_id,
        step_id=run.step_id,
        decision="REQUEUE" if run.phase in ("rollback", "failed") else "RETRYSTEP",
        cause=run.cause,
        phase=run.phase,
        done=done,
        attempt=run.attempt + 1,
        nodelist=nodelist,
        nnodes=len(nodes) if nodes else None,
        exclude=parked,
        rdzv_host=expand_hostlist(nodelist)[0] if nodes else "",  # Slurm's first
        retry_after_s=retry_after_s if nodes else 0.0,
        created_at=at(run.created_at),
        updated_at=at(run.updated_at),
    )
