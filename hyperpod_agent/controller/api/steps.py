"""Step retry inside the allocation: ``POST /v1/steps/retry``, ``GET /v1/steps/retry/{id}``.

The caller is the failed step (the ``hyperpod step-retry`` helper around srun): it may
ask only about its own job, an admin about any. The answer comes at once; RETRYSTEP
starts a surgery (stepretry_run.py) that the helper polls until ``done``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response
from fastapi import Path as FastApiPath

from hyperpod_agent.auth.config import AuthError, Identity, describe
from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.api.models import (
    StepFailureIn,
    StepRetryOut,
    StepWatchIn,
    StepWatchOut,
)
from hyperpod_agent.controller.api.views import at, step_retry_view
from hyperpod_agent.controller.ingest import Rejected
from hyperpod_agent.controller.snapshot import Snapshot
from hyperpod_agent.controller.stepretry.plan import (
    Outcome,
    StepFailure,
    StepPlan,
    attributable,
    backoff_s,
    budget_of,
    decide_step,
)
from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.controller.store.steps import StepRetry
from hyperpod_agent.errors import SlurmError
from hyperpod_agent.slurm.hostlist import expand_hostlist
from hyperpod_agent.slurm.models import Job

if TYPE_CHECKING:
    from hyperpod_agent.controller.service import Controller

MAX_ID = 2**63 - 1
# A watch not renewed within WATCH_TTL_S is gone (the helper died): the policy no
# longer waits for its step's retry.
WATCH_RENEW_S = 1.0
WATCH_TTL_S = 10.0


def may_ask(who: Identity, job: Job) -> None:
    """A job's own step may ask about it: an admin; a node's credential on one of the
    job's nodes; a user's (MUNGE) credential of the job's owner."""
    if who.is_admin:
        return
    if who.node is not None and who.node in job.nodes:
        return
    if who.node is None and who.uid >= 0 and job.uid is not None and who.uid == job.uid:
        return
    raise AuthError(f"{describe(who)} may only ask about its own job, not {job.job_id}", 403)


def _job(controller: Controller, job_id: int, fresh: bool) -> Job:
    """Slurm's view of the job: read now for a decision, the last pass's for a poll."""
    jobs = controller.jobs
    if fresh or all(j.job_id != job_id for j in jobs):
        try:
            jobs = controller.slurm.list_jobs()
        except SlurmError as exc:
            raise Rejected(503, "slurm_unavailable", f"cannot read Slurm: {exc}") from exc
    job = next((j for j in jobs if j.job_id == job_id), None)
    if job is None:
        raise Rejected(404, "not_found", f"job {job_id} is not in Slurm's view")
    return job


def _decide(controller: Controller, job: Job, failure: StepFailure, who: str) -> StepRetryOut:
    """Decide and record, under the pass's plan lock (the policy sees the surgery)."""
    store = controller.store
    try:
        nodes = {n.name: n for n in controller.slurm.list_nodes()}
    except SlurmError as exc:
        raise Rejected(503, "slurm_unavailable", f"cannot read Slurm: {exc}") from exc
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
            store.step_retries_done(job.job_id, failure.step_id),
            store.step_retries_since(now - 60.0),
        )
        metrics.STEP_RETRIES.labels(plan.outcome.value).inc()
        if plan.outcome is Outcome.RETRYSTEP:
            budget = budget_of(failure, job, snap, controller.config.auto_resume.default_attempts)
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
    return StepRetryOut(
        id=None,
        job_id=job.job_id,
        step_id=failure.step_id,
        decision=plan.outcome.value,  # type: ignore[arg-type]
        cause=plan.cause,
        phase=None,
        done=True,
        attempt=failure.attempt + 1,
        created_at=at(now),
        updated_at=at(now),
    )


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
    )
    controller.wake.set()
    run = controller.store.step_retry(run_id)
    assert run is not None
    return step_retry_view(run)


def _watch(controller: Controller, job: Job, body: StepWatchIn, who: str) -> StepWatchOut:
    """Renew the step's watch; tell it to end when one of its nodes has a serious fault
    that appeared since the launch began. Only faults: the pass's view of a node (out
    under our reason, not responding) may be older than a resume, and a dead node ends
    srun by itself. The step's own node list decides (the pass's view of the job may
    still hold a node a surgery just took out), within the job's nodes."""
    store = controller.store
    now = controller.clock()
    nodes = [n for n in expand_hostlist(body.nodelist) if n in job.nodes]
    began = body.started_at.timestamp() if body.started_at is not None else 0.0
    fresh = [f for f in store.open_faults() if f.first_seen >= began]
    snap = Snapshot(nodes={}, jobs=[job], open_faults=fresh)
    since = now - controller.config.auto_resume.fault_window_s  # open faults only here
    causes = [found[0] for n in nodes if (found := attributable(n, snap, since))]
    end = bool(causes) and job.state.upper() == "RUNNING"
    cause = "; ".join(causes) if end else ""
    end_at = store.watch_step(job.job_id, body.step_id, body.attempt, now, WATCH_TTL_S, end=end)
    if end and end_at == now:
        message = (
            f"step {body.step_id} of job {job.job_id} (attempt {body.attempt}) told to end "
            f"now, watched by {who}: {cause}"
        )
        store.add_event("step_end", message, now, job_id=job.job_id, cause=cause)
    return StepWatchOut(end=end, cause=cause, renew_every_s=WATCH_RENEW_S)


def _backoff(controller: Controller, run: StepRetry) -> float:
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


def add_step_routes(
    app: FastAPI,
    controller: Controller,
    identity: Callable[[Request], Identity],
    errors: dict[int | str, dict[str, Any]],
) -> None:
    ERRORS = errors  # noqa: N806 - the same name the other routes use

    @app.post("/v1/steps/retry", response_model=StepRetryOut, responses=ERRORS)
    def post_step_retry(body: StepFailureIn, request: Request, response: Response) -> StepRetryOut:
        """A failed ``--auto-resume`` step asks what to do: RETRYSTEP (202, a surgery
        started: poll it), REQUEUE or FAIL (200, final)."""
        who = identity(request)
        controller.require_leader()  # a standby neither reads Slurm nor starts surgery
        job = _job(controller, body.job_id, fresh=True)
        may_ask(who, job)
        failure = StepFailure(
            body.job_id,
            body.step_id,
            body.exit_code,
            tuple(expand_hostlist(body.nodelist)),
            body.attempt,
            body.auto_resume,
            body.cancelled,
            body.started_at.timestamp() if body.started_at is not None else None,
        )
        out = _decide(controller, job, failure, describe(who))
        response.status_code = 202 if out.decision == "RETRYSTEP" and not out.done else 200
        return out

    @app.post("/v1/steps/watch", response_model=StepWatchOut, responses=ERRORS)
    def post_step_watch(body: StepWatchIn, request: Request) -> StepWatchOut:
        """A running ``--auto-resume`` step under a step-retry helper, renewed every
        ``renew_every_s``: ``end`` when a node of it is faulty (end it now, then ask for
        its retry) rather than wait for the collective to time out."""
        who = identity(request)
        controller.require_leader()
        job = _job(controller, body.job_id, fresh=False)
        may_ask(who, job)
        return _watch(controller, job, body, describe(who))

    @app.get("/v1/steps/retry/{retry_id}", response_model=StepRetryOut, responses=ERRORS)
    def get_step_retry(
        request: Request, retry_id: int = FastApiPath(ge=1, le=MAX_ID)
    ) -> StepRetryOut:
        """A surgery's phase; once ``done``, the new node list or REQUEUE with the cause."""
        who = identity(request)
        run = controller.store.step_retry(retry_id)
        if run is None:
            raise Rejected(404, "not_found", f"no step retry {retry_id}")
        if not who.is_admin:
            may_ask(who, _job(controller, run.job_id, fresh=False))
        return step_retry_view(run, _backoff(controller, run))
