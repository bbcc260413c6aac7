"""The plan's items that only write the state store, never Slurm: a job auto-resume
leaves alone, a hang or straggler declared, a deep-check run planned (the check runner
takes it through Slurm), a hung job's watched step told to end. Each is one
transaction with its event."""

from __future__ import annotations

import logging
from dataclasses import replace

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.snapshot import Kind, PlannedAction
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import ActionRow, EventIn, FindingRow, TrackedJob

log = logging.getLogger(__name__)


def job_verdict(store: Store, pa: PlannedAction, now: float) -> None:
    """Bookkeeping for a job auto-resume leaves alone: budget spent (for good) or a
    failure on healthy nodes (until a fault on its nodes turns up)."""
    assert pa.job_id is not None
    old = store.job(pa.job_id) or TrackedJob(pa.job_id, int(pa.params.get("cap", 0)))
    state, kind = (
        ("exhausted", "budget_spent") if pa.kind is Kind.EXHAUST else ("failed", "not_requeued")
    )
    message = f"job {pa.job_id}: not requeued: {pa.cause}"
    store.upsert_job(
        replace(old, last_cause=pa.cause, state=state, updated_at=now),
        [EventIn(kind, message, pa.node, pa.job_id, pa.cause)],
        now,
    )
    log.info("%s", message)


def finding(store: Store, pa: PlannedAction, now: float) -> None:
    """Declare a hang or straggler once: the row and its event in one transaction."""
    p = pa.params
    row = FindingRow(
        0,
        str(p["kind"]),
        int(p["job_id"]),
        int(p["restart_count"]),
        str(p.get("node", "")),
        int(p.get("step", -1)),
        pa.cause,
        now,
    )
    event = EventIn(row.kind, pa.cause, pa.node, row.job_id, pa.cause)
    if store.add_finding(row, event):
        metrics.FINDINGS.labels(row.kind).inc()
        if isinstance(idle := p.get("idle_s"), int | float):
            metrics.HANG_IDLE.observe(float(idle))
        log.warning("%s", pa.cause)


def step_end(store: Store, pa: PlannedAction, now: float) -> None:
    """A hung job's watched steps told to end (their helpers read it at their next
    renewal, within a second), with the hang kept for their retry."""
    assert pa.job_id is not None
    message = f"watched step of job {pa.job_id} told to end: {pa.cause}"
    # the event's cause is the hang's record: the step's retry reads it back
    event = EventIn("step_end", message, None, pa.job_id, str(pa.params["hang"]))
    told = store.end_watches_for_hang(pa.job_id, now, event)
    if told:
        log.warning("%s", message)


def would_have(
    store: Store,
    action: str,
    target: str,
    cause: str,
    now: float,
    *,
    node: str | None = None,
    job_id: int | None = None,
) -> None:
    """An automatic action decided in mode = "observe": the event and the count, and
    nothing else (docs/operations.md, "Observe, then act")."""
    message = f"observe: would {action} {target}: {cause}"
    store.add_event("would_have", message, now, node=node, job_id=job_id, cause=cause)
    metrics.WOULD_HAVE.labels(action).inc()
    log.info("%s", message)


def check_run(store: Store, pa: PlannedAction, now: float) -> None:
    """Record a deep-check run; the check runner takes it through Slurm."""
    p = pa.params
    nodes = [str(n) for n in p["nodes"]]
    message = f"deep check ({p['purpose']}, {p['level']}) of {', '.join(nodes)}: {pa.cause}"
    run_id = store.add_check_run(
        nodes,
        str(p["level"]),
        str(p["purpose"]),
        {str(k): str(v) for k, v in dict(p["prior"]).items()},
        "controller",
        False,
        now,
        EventIn("deep_check_planned", message, pa.node, None, pa.cause),
    )
    log.info("deep check run %d planned: %s", run_id, message)


def requeued(old: TrackedJob | None, row: ActionRow, now: float) -> TrackedJob:
    """The job's record once the requeue ``row`` is done: one more attempt spent."""
    assert row.job_id is not None
    cap = int(row.params.get("cap", 0))
    old = old or TrackedJob(row.job_id, cap)
    return replace(
        old,
        cap=cap or old.cap,
        attempts=old.attempts + 1,
        last_cause=row.cause,
        state="requeued",
        last_requeue_at=now,
        acted_restart_count=int(row.params.get("restart_count", 0)),
        updated_at=now,
    )
