"""What a failed step's report becomes: the decision recorded in the store (an event,
a surgery for RETRYSTEP, a would-have in observe mode) and the answer the step's helper
gets; and how a job's step retries read back (``/v1/jobs``). The routes that call this
are ``steps.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hyperpod_agent.controller import metrics, records
from hyperpod_agent.controller.api.models import StepRetryOut
from hyperpod_agent.controller.api.views import at, step_retry_view
from hyperpod_agent.controller.ingest import Rejected
from hyperpod_agent.controller.stepretry.plan import (
    Outcome,
    StepFailure,
    StepPlan,
    backoff_s,
    budget_of,
    decide_step,
)
from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.controller.store.steps import StepRetry
from hyperpod_agent.slurm.models import Job, Node

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hyperpod_agent.controller.service import Controller


def record_decision(
    controller: Controller,
    job: Job,
    failure: StepFailure,
    who: str,
    nodes: Mapping[str, Node],
) -> StepRetryOut:
    """Decide and record, under the pass's plan lock (the policy sees the surgery)."""
    store = controller.store
    with controller.plan_lock:
        known = store.find_step_retry(job.job_id, failure.step_id, failure.attempt)
        if known is not None:  # asked again (a lost answer): the same surgery
            return step_retry_view(known)
        other = [r for r in store.open_step_retries() if r.job_id == job.job_id]
        if other:
            raise Rejected(409, "busy", f"job {job.job_id}: step retry {other[0].id} is under way")
        now = controller.clock()
        snap = controller.snapshot(nodes, [job], now)
        plan = decide_step(
            job,
            failure,
            snap,
            controller.config,
            now,
            store.step_retries_done(job.job_id),
            store.step_retries_since(now - 60.0),
        )
        metrics.STEP_RETRIES.labels(plan.outcome.value).inc()
        if plan.outcome is Outcome.RETRYSTEP and controller.config.policy.observe:
            return _would_have(controller, job, failure, plan, who, now)
        if plan.outcome is Outcome.RETRYSTEP:
            budget = budget_of(job, snap, controller.config.auto_resume.default_attempts)
            return _start(controller, job, failure, plan, budget, who, now)
    message = (
        f"step {failure.step_id} of job {job.job_id} (attempt {failure.attempt}, exit "
        f"{failure.exit_code}) reported by {who}: {plan.outcome.value}: {plan.cause}"
    )
    kind = "step_retry_requeue" if plan.outcome is Outcome.REQUEUE else "step_retry_fail"
    store.add_event(kind, message, now, job_id=job.job_id, cause=plan.cause)
    # Answered for good: the job's fault is today's recovery's again, at once.
    store.unwatch_job(job.job_id)
    controller.wake.set()
    return _answered(job, failure, plan.outcome, plan.cause, now)


def _answered(
    job: Job, failure: StepFailure, outcome: Outcome, cause: str, now: float
) -> StepRetryOut:
    """A decision answered at once, no surgery behind it (REQUEUE or FAIL)."""
    return StepRetryOut(
        id=None,
        job_id=job.job_id,
        step_id=failure.step_id,
        decision=outcome.value,
        cause=cause,
        phase=None,
        done=True,
        attempt=failure.attempt + 1,
        created_at=at(now),
        updated_at=at(now),
    )


def _would_have(
    controller: Controller,
    job: Job,
    failure: StepFailure,
    plan: StepPlan,
    who: str,
    now: float,
) -> StepRetryOut:
    """Observe mode: the in-place retry decided and counted, not made. The step is
    answered FAIL, so the job goes on as it would without this controller (its requeue,
    if auto-resume asks for one, is the pass's would-have)."""
    target = f"job {job.job_id} step {failure.step_id} on {plan.spare} for {plan.bad_node}"
    cause = f"reported by {who}: {plan.cause}"
    records.would_have(
        controller.store, "step_retry", target, cause, now, node=plan.bad_node, job_id=job.job_id
    )
    said = f'mode = "observe": would {plan.outcome.value}: {plan.cause}'
    return _answered(job, failure, Outcome.FAIL, said, now)


def _start(
    controller: Controller,
    job: Job,
    failure: StepFailure,
    plan: StepPlan,
    budget: int,
    who: str,
    now: float,
) -> StepRetryOut:
    message = (
        f"step {failure.step_id} of job {job.job_id} (attempt {failure.attempt}, exit "
        f"{failure.exit_code}) reported by {who}: RETRYSTEP: {plan.cause}"
    )
    fields = {
        "bad_node": plan.bad_node,
        "spare": plan.spare,
        "reason": plan.reason,
        "keep": plan.keep,
        "cause": plan.cause,
    }
    run_id, _ = controller.store.add_step_retry(
        job.job_id,
        failure.step_id,
        failure.attempt,
        budget,
        fields,
        who,
        now,
        EventIn("step_retry_planned", message, plan.bad_node, job.job_id, plan.cause),
        owner_uid=job.uid,
    )
    controller.wake.set()
    run = controller.store.step_retry(run_id)
    assert run is not None
    return step_retry_view(run)


def retry_backoff(controller: Controller, run: StepRetry) -> float:
    """The relaunch's back-off: earlier in-place retries of the same step count."""
    if run.outcome != "RETRYSTEP":
        return 0.0
    earlier = sorted(
        (r.id, r.updated_at)
        for r in controller.store.job_step_retries(run.job_id)
        if r.step_id == run.step_id and r.id < run.id and r.outcome == "RETRYSTEP"
    )
    ar = controller.config.auto_resume
    return backoff_s([at_ for _, at_ in earlier], controller.clock(), ar)


def job_step_fields(controller: Controller, job_id: int, history: bool = False) -> dict[str, Any]:
    """What ``/v1/jobs`` shows of a job's step retries: how many were done, the last
    one (its phase while under way), and with ``history`` every one."""
    runs = controller.store.job_step_retries(job_id)
    fields: dict[str, Any] = {
        "step_retries": sum(1 for r in runs if r.outcome == "RETRYSTEP"),
        "last_step_retry": step_retry_view(runs[0]) if runs else None,
    }
    if history:
        fields["step_retry_history"] = [step_retry_view(r) for r in runs]
    return fields
