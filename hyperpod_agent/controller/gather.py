"""What the policy sees: one Snapshot, gathered from the store and a pass's Slurm view.

The reads are here, apart from the loop that calls them (service.py) and the pure
decision that uses them (policy.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from pydantic import TypeAdapter, ValidationError

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.ingest import Heartbeat
from hyperpod_agent.controller.snapshot import NodeHealth, Snapshot
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import NodeRow
from hyperpod_agent.health import JobProgress, Verdict
from hyperpod_agent.slurm.models import Job, Node

log = logging.getLogger(__name__)

_PROGRESS = TypeAdapter(list[JobProgress])


def gather(
    store: Store,
    config: ControllerConfig,
    beats: Mapping[str, Heartbeat],
    started_at: float,
    nodes: Mapping[str, Node],
    jobs: Sequence[Job],
    now: float,
) -> Snapshot:
    """Everything the policy needs, from the store and this pass's Slurm view."""
    policy = config.policy
    health = {}
    for name, row in store.node_rows().items():
        beat = beats.get(name)
        seen = [t for t in (row.received_at, row.heartbeat_at, beat and beat.sent_at) if t]
        health[name] = NodeHealth(
            verdict=Verdict(row.verdict) if row.verdict else None,
            generated_at=row.generated_at,
            last_seen=max(seen) if seen else None,
            jobs_opted_in=row.opted_in(),
            progress=_progress(row),
        )
    longest = max(
        policy.escalation_window_s,
        policy.lemon_window_s,
        config.auto_resume.fault_window_s,
    )
    open_rows = store.open_actions()
    done = store.done_since(now - policy.escalation_window_s)
    return Snapshot(
        nodes=nodes,
        jobs=jobs,
        health=health,
        open_faults=store.open_faults(),
        history=store.faults_since(now - longest),
        burst_peers=store.burst_peers(policy.shared_cause_window_s),
        in_flight=open_rows,
        done=done,
        tracked=store.jobs(),
        requeues_last_minute=store.actions_since("requeue", now - 60.0),
        started_at=started_at,
        replaced=store.replaced_nodes(),
        findings=store.findings_since(now - policy.lemon_window_s),
        # only the gates read them: no query over every result when both are off
        check_outcomes=(
            store.latest_outcomes()
            if config.deep_checks.reentry_gate_on or config.deep_checks.spare_gate_on
            else {}
        ),
        checking=frozenset(n for r in store.open_check_runs() for n in r.nodes),
        step_retries={r.job_id: (r.bad_node, r.spare) for r in store.open_step_retries()},
        watched_jobs=store.watched_jobs(now),
        watch_launched=store.watch_launches(now),
    )


def _progress(row: NodeRow) -> tuple[JobProgress, ...]:
    """The node's training progress as stored from its last report (validated there)."""
    if not row.progress or row.progress == "[]":
        return ()
    try:
        return tuple(_PROGRESS.validate_json(row.progress))
    except ValidationError:
        log.warning("%s: stored progress unreadable; ignored this pass", row.name)
        return ()
