"""Builders for the goodput tests: events as the controller writes them, progress marks,
and the recoveries of the shipped paths as event sequences."""

from __future__ import annotations

from itertools import count

from hyperpod_agent.controller.goodput import JobRecord, ProgressMark
from hyperpod_agent.controller.store.rows import EventRow

T0 = 1_800_000_000.0
_ids = count(1)


def ev(
    at: float,
    kind: str,
    node: str | None = None,
    job: int | None = None,
    cause: str = "",
    message: str = "",
) -> EventRow:
    return EventRow(next(_ids), T0 + at, kind, node, job, cause, message)


def fault(at: float, node: str, code: str = "xid79") -> EventRow:
    return ev(at, "fault", node, None, f"gpu3 {code}", f"{node}: gpu3 {code} (REBOOT, urgent): x")


def resumed(
    at: float, job: int, step: int, restart: int = 0, reached: int | None = None
) -> EventRow:
    """As controller/jobwatch.py words it (``reached``: the highest step seen before)."""
    said = "" if reached is None else f"; it had reached step {reached}"
    return ev(
        at,
        "resumed",
        None,
        job,
        "/ckpt/resume.json",
        f"job {job} resumed from step {step} (restart {restart}){said}",
    )


def mark(
    at: float,
    step: int,
    job: int = 7,
    rank: int = 0,
    seen: float | None = None,
    step_s: float | None = 2.0,
    paused: bool = False,
    reason: str = "",
    since: float | None = None,
) -> ProgressMark:
    """Rank ``rank`` seen at ``seen`` (default: when its step finished)."""
    return ProgressMark(
        job_id=job,
        rank=rank,
        seen_at=T0 + (at if seen is None else seen),
        step=step,
        step_at=T0 + at,
        paused=paused,
        pause_reason=reason,
        pause_since=None if since is None else T0 + since,
        step_s=step_s,
    )


def running(
    job: int = 7,
    start: float = 0.0,
    nodes: tuple[str, ...] = ("n1", "n2"),
    state: str = "RUNNING",
    end: float | None = None,
    held: tuple[str, ...] = (),
) -> JobRecord:
    return JobRecord(
        job,
        state=state,
        started_at=T0 + start,
        ended_at=None if end is None else T0 + end,
        nodes=frozenset(nodes) | frozenset(held),
        node_count=len(nodes),
    )


def step_retry(at: float, job: int = 7, bad: str = "n2") -> list[EventRow]:
    """A fault on ``bad`` at ``at`` retried in place: told to end at +1, the retry asked
    for at +3, drained +3.5, shrunk +4, spare merged +6 (RETRYSTEP)."""
    return [
        fault(at, bad),
        ev(at + 1, "step_end", None, job, "gpu3 xid79 on n2"),
        ev(at + 3, "step_retry_planned", bad, job, "gpu3 xid79"),
        ev(at + 3.5, "step_retry_drain", bad, job, "step retry"),
        ev(at + 4, "step_retry_shrink", bad, job, "step retry"),
        ev(at + 6, "step_retry_absorb", bad, job, "step retry"),
        ev(at + 6, "step_retry_done", bad, job, "step retry"),
        ev(at + 6, "replace", bad, job, "step retry 1 of job 7"),
    ]


def requeued(at: float, job: int = 7, bad: str = "n2") -> list[EventRow]:
    """A fault on ``bad`` at ``at``: drained at +2 and the job requeued in the same pass."""
    return [
        fault(at, bad),
        ev(at + 2, "drain", bad, None, "gpu3 xid79", f"drain {bad} reason='hyperpod:drain'"),
        ev(at + 2, "requeue", None, job, f"urgent fault on {bad}", f"requeue job {job}"),
    ]
