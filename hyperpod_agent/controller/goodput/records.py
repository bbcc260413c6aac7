"""The controller's records as the goodput computation reads them: Slurm's job, the
requeues the controller made, the ranks' progress from the agents' reports. Pure
conversions; the reads are in controller/api/goodput.py."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hyperpod_agent.controller.goodput.model import JobRecord, ProgressMark
from hyperpod_agent.controller.store.rows import ActionRow
from hyperpod_agent.health import JobProgress
from hyperpod_agent.slurm.models import Job


def job_record(job_id: int, slurm: Job | None, actions: Sequence[ActionRow]) -> JobRecord:
    """The job as Slurm shows it now (``slurm`` None: it no longer does), with the nodes
    it held before each requeue (a requeue's parameters name them)."""
    held = {
        str(n)
        for a in actions
        if a.kind == "requeue" and isinstance(a.params.get("nodes"), list)
        for n in a.params["nodes"]
    }
    if slurm is None:
        return JobRecord(job_id, nodes=frozenset(held))
    return JobRecord(
        job_id,
        state=slurm.state.upper(),
        started_at=slurm.start_time.timestamp() if slurm.start_time is not None else None,
        ended_at=slurm.end_time.timestamp() if slurm.end_time is not None else None,
        nodes=frozenset(held | set(slurm.nodes)),
        node_count=len(slurm.nodes),
    )


def progress_marks(reports: Iterable[tuple[float, Sequence[JobProgress]]]) -> list[ProgressMark]:
    """Every rank's progress from (when the controller received it, the report's
    progress) pairs: one mark per rank and report."""
    return [
        ProgressMark(
            job_id=jp.job_id,
            rank=r.rank,
            seen_at=seen_at,
            step=r.step,
            step_at=r.step_at,
            paused=r.paused,
            pause_reason=r.pause_reason,
            pause_since=r.pause_since,
            # a step's duration: last_s always is one (median_s may be a compute time)
            step_s=r.last_s,
        )
        for seen_at, progress in reports
        for jp in progress
        for r in jp.ranks
    ]
