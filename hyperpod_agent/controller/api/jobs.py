"""The job routes: ``GET /v1/jobs``, ``GET /v1/jobs/{id}`` and the job-end notice
``POST /v1/jobs/{id}/ended`` (EpilogSlurmctld, admin only)."""

from __future__ import annotations

import pwd
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi import Path as FastApiPath
from starlette.exceptions import HTTPException as StarletteHTTPException

from hyperpod_agent.auth.config import AuthError, Identity, describe
from hyperpod_agent.controller.api import views
from hyperpod_agent.controller.api.callers import identity_of
from hyperpod_agent.controller.api.goodput import job_of
from hyperpod_agent.controller.api.models import (
    ERRORS,
    MAX_INT64,
    JobDetail,
    JobEndedIn,
    JobEndedOut,
    JobOut,
)
from hyperpod_agent.controller.api.step_answers import job_step_fields
from hyperpod_agent.controller.store.rows import TrackedJob

if TYPE_CHECKING:
    from hyperpod_agent.controller.service import Controller


def is_slurm_user(identity: Identity, slurm_user: str) -> bool:
    """Is the caller slurm.conf's SlurmUser (a Unix identity from munge)?"""
    if identity.method != "munge" or identity.uid < 0:
        return False
    try:
        return pwd.getpwnam(slurm_user).pw_uid == identity.uid
    except KeyError:
        return slurm_user.isdigit() and int(slurm_user) == identity.uid


def add_job_routes(app: FastAPI, controller: Controller) -> None:
    async def admin_or_slurm_user(request: Request) -> None:
        """Who asks is checked before the body is read. EpilogSlurmctld runs as
        SlurmUser, which is rarely root or in admin_group: its munge identity may report
        job ends (and nothing else). A notice only makes the controller look at the job
        in Slurm at once; it changes nothing by itself."""
        identity = identity_of(request)
        if not identity.is_admin and not is_slurm_user(identity, controller.config.slurm_user):
            raise AuthError("admin or SlurmUser identity required to report a job's end", 403)

    """Register the job routes on ``app``."""

    def _job_out(
        t: TrackedJob, cls: type[JobOut] = JobOut, history: bool = False, **extra: Any
    ) -> JobOut:
        job = next((j for j in controller.jobs if j.job_id == t.job_id), None)
        return cls(
            **job_step_fields(controller, t.job_id, history),
            job_id=t.job_id,
            state=job.state if job else None,
            nodes=list(job.nodes) if job else [],
            restart_count=job.restart_count if job else None,
            cap=t.cap,
            attempts=t.attempts,
            last_cause=t.last_cause,
            tracking=t.state,
            last_requeue_at=views.ts(t.last_requeue_at),
            resumed_from_step=t.resumed_from_step,
            findings=[
                views.finding_view(f) for f in controller.store.job_findings(t.job_id, limit=20)
            ],
            **extra,
        )

    @app.get("/v1/jobs", response_model=list[JobOut], responses=ERRORS)
    def jobs(request: Request) -> list[JobOut]:
        """Auto-resume jobs the controller tracks, and running jobs it found hung or
        straggling (tracking ``progress``)."""
        identity_of(request)
        tracked = controller.store.jobs()
        running = {j.job_id for j in controller.jobs if j.state.upper() == "RUNNING"}
        others = sorted(
            j for j in running - set(tracked) if controller.store.job_findings(j, limit=1)
        )
        retried = [j for j in controller.store.step_retry_jobs() if j not in tracked]
        return [
            *(_job_out(t) for t in tracked.values()),
            *(_job_out(TrackedJob(j, 0, state="progress")) for j in others if j not in retried),
            *(_job_out(TrackedJob(j, 0, state="step-retry")) for j in retried),
        ]

    @app.get("/v1/jobs/{job_id}", response_model=JobDetail, responses=ERRORS)
    def job(request: Request, job_id: int = FastApiPath(ge=1, le=MAX_INT64)) -> JobOut:
        identity_of(request)
        tracked = controller.store.job(job_id)
        if tracked is None and controller.store.job_step_retries(job_id, limit=1):
            tracked = TrackedJob(job_id, 0, state="step-retry")
        if tracked is None:
            raise StarletteHTTPException(404, f"job {job_id} is not tracked")
        return _job_out(
            tracked,
            JobDetail,
            history=True,
            events=[views.event_view(e) for e in controller.store.events(job_id=job_id, limit=200)],
            actions=[views.action_view(a) for a in controller.store.job_actions(job_id)],
            goodput=job_of(controller, job_id, controller.clock(), None),
        )

    @app.post(
        "/v1/jobs/{job_id}/ended",
        response_model=JobEndedOut,
        responses=ERRORS,
        dependencies=[Depends(admin_or_slurm_user)],
    )
    def job_ended(
        request: Request,
        body: JobEndedIn | None = None,
        job_id: int = FastApiPath(ge=1, le=MAX_INT64),
    ) -> JobEndedOut:
        """EpilogSlurmctld: a job ended; an auto-resume job is looked at at once."""
        identity = identity_of(request)
        controller.require_leader()
        ended = body or JobEndedIn()
        who = f"EpilogSlurmctld ({describe(identity)})"
        tracked = controller.job_ended(job_id, ended.exit_code, ended.state, who)
        return JobEndedOut(tracked=tracked)
