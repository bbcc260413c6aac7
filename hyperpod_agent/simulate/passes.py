"""The controller's side of the simulation: its passes and its answer to a failed step.

Each reconcile pass builds the policy's view of the cluster (``cluster.snapshot``) and
calls the real ``controller.policy.decide``; a failed watched step calls the real
``controller.stepretry.plan.decide_step``. Their answers are carried out on the simulated
nodes (``remedy.py``); nothing here decides anything itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.safety import parsed_reason
from hyperpod_agent.controller.snapshot import WATCH_GRACE_S, Kind
from hyperpod_agent.controller.stepretry.plan import Outcome, StepFailure, decide_step
from hyperpod_agent.controller.store.rows import FaultRow, TrackedJob
from hyperpod_agent.reasons import Verb
from hyperpod_agent.simulate.causes import FaultClass
from hyperpod_agent.simulate.cluster import Cluster, JobState, Role
from hyperpod_agent.simulate.remedy import apply_node_action, bring_in, index_of, take_out
from hyperpod_agent.simulate.view import view


def open_fault(cluster: Cluster, i: int, cls: FaultClass, now: float) -> None:
    """The agent reported the fault: the store opens it (and keeps it in history)."""
    n = cluster.nodes[i]
    row = FaultRow(
        cluster.next_id(), n.name, cls.component, cls.code, "FAIL", cls.action.value,
        cls.urgent, now, now, 1, cls.name, None,
    )  # fmt: skip
    n.fault_row = row
    n.history.append(row)
    cluster.recent[i] = now
    cluster.touch(i)


def close_fault(cluster: Cluster, i: int, now: float) -> None:
    """The agent reports the node healthy: the store closes its open fault."""
    n = cluster.nodes[i]
    row = n.fault_row
    if row is None:
        return
    closed = replace(row, last_seen=now, closed_at=now)
    n.history = type(n.history)(closed if h.id == row.id else h for h in n.history)
    n.fault_row = None
    cluster.recent[i] = now  # a fault closed near a job's end still explains it
    cluster.touch(i)


@dataclass
class PassOutcome:
    """What one pass did that the event loop must follow up."""

    requeued: bool = False
    exhausted: bool = False
    not_retried: bool = False
    reboots: list[tuple[int, float]] = field(default_factory=list)  # node, reboot ends
    incident: bool = False


def controller_pass(
    cluster: Cluster,
    job: JobState,
    now: float,
    dead_since: dict[int, float],
    reboot_s: Callable[[], float],
) -> PassOutcome:
    """One reconcile pass: ``decide`` on the view, its actions carried out."""
    cluster.trim(now)
    snap, config = view(cluster, job, now, dead_since)
    decision = decide(snap, config, now)
    out = PassOutcome(incident=decision.incident)
    for a in decision.actions:
        if a.kind is Kind.REQUEUE and a.job_id == job.job_id:
            prior = job.tracked.attempts if job.tracked else 0
            job.tracked = TrackedJob(
                job.job_id, int(a.params.get("cap", job.cap)), prior + 1, a.cause, "requeued",
                now, job.restart_count, None, now,
            )  # fmt: skip
            cluster.requeue_times.append(now)
            out.requeued = True
        elif a.kind is Kind.EXHAUST and a.job_id == job.job_id:
            out.exhausted = True
        elif a.kind is Kind.NOT_RETRIED and a.job_id == job.job_id:
            # said once; a fault found on its nodes later still requeues it (autoresume)
            t = job.tracked or TrackedJob(job.job_id, int(a.params.get("cap", job.cap)))
            job.tracked = replace(t, state="failed", updated_at=now)
            out.not_retried = True
        else:
            until = apply_node_action(cluster, job, a, now, reboot_s)
            if a.node is not None:
                cluster.touch(index_of(a.node))
                if a.params.get("spare"):
                    cluster.touch(index_of(str(a.params["spare"])))
            if until is not None and a.node is not None:
                out.reboots.append((index_of(a.node), until))
    return out


def next_timer(
    cluster: Cluster, job: JobState, now: float, dead_since: dict[int, float]
) -> float | None:
    """When the policy's next time rule could change its answer, or None: a fault out of
    its shared-cause window, a heartbeat timed out, a GPU reset's timeout, a step
    watch's grace, a requeue's back-off or the cluster-wide requeue cap over. The
    production loop passes every reconcile interval; between these moments, with nothing
    reported, it would decide the same (every other input is an event the simulation
    wakes a pass for)."""
    cfg = cluster.config
    times: list[float] = []
    for i in cluster.timed:  # the nodes in play these rules can read (Cluster.touch)
        n = cluster.nodes[i]
        if n.role in (Role.JOB, Role.IDLE) and n.fault_row is not None:
            times.append(n.fault_row.first_seen + cfg.policy.shared_cause_window_s)
        if n.role in (Role.JOB, Role.IDLE) and n.dead and i in dead_since:
            times.append(dead_since[i] + cfg.policy.heartbeat_timeout_s)
        ours = parsed_reason(n.reason) if n.role is Role.OUT else None
        if ours is not None and ours.verb is Verb.RESET:
            times.append(n.reason_time + cfg.policy.reset_timeout_s)
    if job.told_to_end is not None:  # a watch protects the job's nodes this long
        times.append(job.told_to_end + WATCH_GRACE_S)
    t = job.tracked
    if t is not None and t.last_requeue_at is not None and t.attempts > 0:
        ar = cfg.auto_resume
        times.append(
            t.last_requeue_at + min(ar.backoff_max_s, ar.backoff_base_s * 2 ** (t.attempts - 1))
        )
    if cluster.requeue_times:
        times.append(cluster.requeue_times[0] + 60.0)
    later = [x for x in times if x > now]
    # a hair after the boundary: the rules compare with >= and <
    return min(later) + 1e-3 if later else None


def step_decision(
    cluster: Cluster, job: JobState, now: float, dead_since: dict[int, float]
) -> Outcome:
    """A watched step failed: ask ``decide_step``; on RETRYSTEP do the surgery (the bad
    node out under the plan's reason, held for repair; the spare into the job)."""
    cluster.trim(now)
    job.told_to_end = now
    snap, config = view(cluster, job, now, dead_since, step=True)
    job_view = snap.jobs[0]
    failure = StepFailure(
        job.job_id, "0", 1, job_view.nodes, job.retries_done + 1, started_at=job.start_time
    )
    plan = decide_step(
        job_view, failure, snap, config, now, job.retries_done, len(cluster.retry_times)
    )
    if plan.outcome is Outcome.RETRYSTEP:
        bad, spare = index_of(plan.bad_node), index_of(plan.spare)
        take_out(cluster, job, bad, plan.reason, now, shrink=True)
        cluster.nodes[bad].held = cluster.nodes[bad].replaced = True
        bring_in(cluster, spare, now)
        cluster.nodes[spare].role = Role.JOB
        job.nodes.add(spare)
        cluster.touch(bad)
        cluster.touch(spare)
        job.retries_done += 1
        cluster.retry_times.append(now)
    return plan.outcome
