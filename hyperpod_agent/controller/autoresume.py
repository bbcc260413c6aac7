"""Auto-resume rules: which opted-in jobs to requeue (DESIGN §4). Pure.

A job is opted in when Slurm shows ``--auto-resume=N`` (``Job.auto_resume``, from
``admin_comment``) or an agent saw it on its node (``NodeReport.jobs_opted_in``).
``N`` caps the requeues, except ``1``: the plain HyperPod switch, which gets
``auto_resume.default_attempts``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.reasons import parse_reason
from hyperpod_agent.controller.snapshot import Kind, PlannedAction, PlannedEvent, Snapshot
from hyperpod_agent.controller.store_rows import FaultRow
from hyperpod_agent.slurm.models import Job

MAX_CAP = 1000  # the SPANK option's upper bound


def cap_of(job: Job, snap: Snapshot, default_attempts: int) -> int | None:
    """The job's retry budget, or None when it did not opt in."""
    values = [job.auto_resume] if job.auto_resume else []
    values += [
        h.jobs_opted_in[job.job_id] for h in snap.health.values() if h.jobs_opted_in.get(job.job_id)
    ]
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    cap = max(values)
    # An agent's report is input: keep the budget within what --auto-resume accepts.
    return default_attempts if cap == 1 else min(cap, MAX_CAP)


def _faulty_nodes(
    job: Job, snap: Snapshot, now: float, window: float, faults: Mapping[str, Sequence[FaultRow]]
) -> list[str]:
    """Nodes of the job that had a fault within the window, or are out by us or dead."""
    bad = []
    for name in job.nodes:
        node = snap.nodes.get(name)
        recent = any(f.node == name and f.last_seen >= now - window for f in snap.history)
        if (
            faults.get(name)
            or recent
            or (node is not None and not node.responding)
            or (node is not None and node.drained and parse_reason(node.reason) is not None)
        ):
            bad.append(name)
    return bad


def _cause(
    job: Job,
    snap: Snapshot,
    config: ControllerConfig,
    now: float,
    urgent_nodes: set[str],
    faults: Mapping[str, Sequence[FaultRow]],
) -> str | None:
    state = job.state.upper()
    if state == "RUNNING":
        hit = sorted(set(job.nodes) & urgent_nodes)
        return f"urgent fault on {','.join(hit)}" if hit else None
    if state == "NODE_FAIL":
        return "job ended NODE_FAIL"
    if state == "FAILED":
        bad = _faulty_nodes(job, snap, now, config.auto_resume.fault_window_s, faults)
        if bad:
            return f"job failed (exit {job.exit_code}) while {','.join(bad)} had a fault"
        if config.auto_resume.retry_on == "any_failure":
            return f"job failed (exit {job.exit_code}); retry_on=any_failure"
    return None


def plan(
    snap: Snapshot,
    config: ControllerConfig,
    now: float,
    urgent_nodes: set[str],
    faults: Mapping[str, Sequence[FaultRow]],
) -> tuple[list[PlannedAction], list[PlannedEvent]]:
    """Requeues (and budget-spent notices) for this pass."""
    ar = config.auto_resume
    if not ar.enabled:
        return [], []
    actions: list[PlannedAction] = []
    events: list[PlannedEvent] = []
    busy = {a.job_id for a in snap.in_flight if a.job_id is not None}
    budget_left = ar.max_requeues_per_minute - snap.requeues_last_minute
    capped: list[int] = []
    for job in sorted(snap.jobs, key=lambda j: j.job_id):
        cap = cap_of(job, snap, ar.default_attempts)
        tracked = snap.tracked.get(job.job_id)
        if cap is None or job.job_id in busy or (tracked and tracked.state == "exhausted"):
            continue
        cause = _cause(job, snap, config, now, urgent_nodes, faults)
        if cause is None:
            continue
        if (
            tracked
            and tracked.acted_restart_count is not None
            and job.restart_count <= tracked.acted_restart_count
        ):
            continue  # this failure was already requeued; Slurm has not caught up
        attempts = tracked.attempts if tracked else 0
        if attempts >= cap:
            actions.append(
                PlannedAction(
                    Kind.EXHAUST,
                    None,
                    "",
                    f"{cause}; retry budget spent ({attempts}/{cap})",
                    job_id=job.job_id,
                    params={"cap": cap},
                )
            )
            continue
        if tracked and tracked.last_requeue_at is not None and attempts > 0:
            wait = min(ar.backoff_max_s, ar.backoff_base_s * 2 ** (attempts - 1))
            if now < tracked.last_requeue_at + wait:
                continue
        if budget_left <= 0:
            capped.append(job.job_id)
            continue
        budget_left -= 1
        actions.append(
            PlannedAction(
                Kind.REQUEUE,
                None,
                "",
                cause,
                job_id=job.job_id,
                params={
                    "cap": cap,
                    "attempt": attempts + 1,
                    "restart_count": job.restart_count,
                    "nodes": list(job.nodes),
                },
            )
        )
    if capped:
        events.append(
            PlannedEvent(
                "requeue_capped",
                f"cluster-wide requeue cap ({ar.max_requeues_per_minute}/min) "
                f"reached; waiting: {', '.join(map(str, capped))}",
            )
        )
    return actions, events
