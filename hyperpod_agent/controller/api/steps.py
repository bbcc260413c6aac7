"""Step retry inside the allocation: ``POST /v1/steps/retry``, ``POST /v1/steps/watch``,
``GET /v1/steps/retry/{id}``.

The caller is a running or failed step (the ``hyperpod step-retry`` helper around
srun): it may ask only about its own job, an admin about any. Who asks is checked
first, against the last pass's view of the job (a dictionary lookup); nothing else is
done for a caller who may not ask, and Slurm is read only for one who may, at most
once per ``FRESH_S`` whoever asks. What the helper says of its step's nodes, its start
or its budget is not used: the nodes and the start are what Slurm said of the job when
the controller began to watch the step, the budget is the job's own opt-in and its
retries are counted per job. RETRYSTEP starts a surgery (stepretry/run.py) that the
helper polls until ``done``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi import Path as FastApiPath

from hyperpod_agent.auth.config import AuthError, Identity, describe
from hyperpod_agent.controller import records
from hyperpod_agent.controller.api.guard import raw_json
from hyperpod_agent.controller.api.models import (
    StepFailureIn,
    StepRetryOut,
    StepWatchIn,
    StepWatchOut,
)
from hyperpod_agent.controller.api.slurm_view import SlurmReads, may_ask, started
from hyperpod_agent.controller.api.step_answers import record_decision, retry_backoff
from hyperpod_agent.controller.api.views import step_retry_view
from hyperpod_agent.controller.hangs.ending import HangEnd
from hyperpod_agent.controller.ingest import Rejected
from hyperpod_agent.controller.snapshot import WATCH_GRACE_S, Snapshot
from hyperpod_agent.controller.stepretry.plan import (
    StepFailure,
    attributable,
    parked_batch_host,
)
from hyperpod_agent.controller.store.steps import StepWatch
from hyperpod_agent.slurm.models import ENDED_STATES, Job, Node

if TYPE_CHECKING:
    from hyperpod_agent.controller.service import Controller

MAX_ID = 2**63 - 1
# A watch not renewed within WATCH_TTL_S is gone (the helper died): the policy no
# longer waits for its step's retry.
WATCH_RENEW_S = 1.0
WATCH_TTL_S = 10.0
# Steps of one job watched at once (its concurrent srun --auto-resume); more is a flood.
MAX_WATCHES = 16
# States of a job that runs no step any more (COMPLETING: its epilog runs).
GONE = ENDED_STATES | {"COMPLETING"}


def step_nodes_of(job: Job, nodes: Mapping[str, Node]) -> tuple[str, ...]:
    """The nodes a step of ``job`` may run on: all of the job's but a batch host an
    earlier retry left in it only as that (its fault is not the step's)."""
    parked = parked_batch_host(job, nodes)
    return tuple(n for n in job.nodes if n != parked)


def _gone(job_id: int, state: str) -> Rejected:
    return Rejected(
        404, "not_found", f"job {job_id} is {state}, not running: no step of it to watch or retry"
    )


class Steps:
    """The step routes' work, each part after the caller was found allowed."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.slurm = SlurmReads(controller)

    def caller_job(self, who: Identity, job_id: int) -> Job:
        """The job as the last pass saw it (or, for a job that started since, as the
        shared read shows it), once ``who`` may ask about it."""
        job = self.slurm.view(job_id)
        if job is None:
            # A job that started after the last pass: its step's first watch must not
            # wait for the next pass, or a fault meanwhile takes the requeue path. The
            # read is the shared one, at most one per FRESH_S whoever asks, so unknown
            # job ids cost the cluster no more than that.
            job = self.slurm.read(0.0)[1].get(job_id)
        if job is None:
            raise Rejected(
                404,
                "not_found",
                f"job {job_id} is not in the controller's view of Slurm (a job that has "
                "just started is, after the next pass)",
            )
        may_ask(who, job)
        return job

    def _surgery_at(self, job_id: int) -> float:
        """When the job's newest surgery last changed it: a read older than that may
        still show the node it took out."""
        runs = self.controller.store.job_step_retries(job_id, limit=1)
        return runs[0].updated_at if runs else 0.0

    def _fresh(self, job_id: int) -> tuple[Mapping[str, Node], dict[int, Job], Job]:
        """Slurm now (a shared read) and the job in it, which must run: an ended or
        requeued job runs no step (its helper is gone with it), and its watches go."""
        nodes, jobs = self.slurm.read(self._surgery_at(job_id))
        job = jobs.get(job_id)
        if job is None or job.state.upper() != "RUNNING":
            self.controller.store.unwatch_job(job_id)
            raise _gone(job_id, job.state if job is not None else "gone from Slurm")
        return nodes, jobs, job

    # -- POST /v1/steps/retry ---------------------------------------------------------
    def retry(self, who: Identity, body: StepFailureIn) -> StepRetryOut:
        c = self.controller
        seen = self.caller_job(who, body.job_id)
        c.require_leader()  # a standby neither reads Slurm nor starts surgery
        known = c.store.find_step_retry(body.job_id, body.step_id, body.attempt)
        if known is not None:  # asked again (a lost answer): the same surgery
            return step_retry_view(known)
        if seen.state.upper() in GONE:
            c.store.unwatch_job(body.job_id)
            raise _gone(body.job_id, seen.state)
        nodes, jobs, job = self._fresh(body.job_id)
        steps_nodes, began, hang = self._step_nodes(job, body.step_id, body.attempt, jobs, nodes)
        failure = StepFailure(
            job.job_id,
            body.step_id,
            body.exit_code,
            steps_nodes,
            body.attempt,
            body.cancelled,
            began,
            hang,
        )
        return record_decision(c, job, failure, describe(who), nodes)

    def _step_nodes(
        self,
        job: Job,
        step_id: str,
        attempt: int,
        jobs: Mapping[int, Job],
        nodes: Mapping[str, Node],
    ) -> tuple[tuple[str, ...], float, HangEnd | None]:
        """The failed step's nodes and its job's start: what its watch recorded from
        Slurm, when that watch was of this launch of this run of the job and renewed
        lately; else the job's nodes now. A recorded node another job holds now is not
        this step's to blame. And the hang the pass ended the step for, if it did."""
        began = started(job)
        row = self.controller.store.step_watch(job.job_id, step_id)
        now = self.controller.clock()
        if (
            row is None
            or row.attempt != attempt
            or row.began != began
            or not row.nodes
            or now > row.expires_at + WATCH_GRACE_S
        ):
            return step_nodes_of(job, nodes), began, None
        held = {
            n
            for j in jobs.values()
            if j.job_id != job.job_id and j.state.upper() not in ENDED_STATES
            for n in j.nodes
        }
        mine = tuple(n for n in row.nodes if n in job.nodes or n not in held)
        return mine, began, self._hang(row)

    def _hang(self, row: StepWatch) -> HangEnd | None:
        """The hang the pass ended this launch for (its ``step_end`` since the launch
        began), or None: only asked once the launch was told to end."""
        if row.end_at is None:
            return None
        return HangEnd.latest(self.controller.store.step_end_causes(row.job_id, row.created_at))

    # -- POST /v1/steps/watch ---------------------------------------------------------
    def watch(self, who: Identity, body: StepWatchIn) -> StepWatchOut:
        c = self.controller
        seen = self.caller_job(who, body.job_id)
        c.require_leader()
        store, now = c.store, c.clock()
        row = store.step_watch(body.job_id, body.step_id)
        live = row is not None and row.expires_at > now
        if row is None or not live or row.attempt != body.attempt or not row.created_at:
            row = self._begin(body, now, live)
        elif self.slurm.view_since(row.created_at) and seen.state.upper() != "RUNNING":
            store.unwatch_job(body.job_id)  # a watch never outlives its job
            raise _gone(body.job_id, seen.state)
        return self._renew(row, seen, describe(who), now)

    def _begin(self, body: StepWatchIn, now: float, live: bool) -> StepWatch:
        """A new launch: its job's nodes and start, read from Slurm now."""
        store = self.controller.store
        if store.live_watches(body.job_id, now) - int(live) >= MAX_WATCHES:
            raise Rejected(
                409, "busy", f"job {body.job_id} has {MAX_WATCHES} steps under watch already"
            )
        slurm_nodes, _, job = self._fresh(body.job_id)
        began = started(job)
        nodes = step_nodes_of(job, slurm_nodes)
        store.start_watch(job.job_id, body.step_id, body.attempt, nodes, began, now, WATCH_TTL_S)
        return StepWatch(job.job_id, body.step_id, body.attempt, now, None, nodes, began, now)

    def _renew(self, row: StepWatch, job: Job, who: str, now: float) -> StepWatchOut:
        """Renew the watch; tell the step to end when one of its nodes has a serious
        fault first reported since its job started. Only faults: the pass's view of a
        node (out under our reason, not responding) may be older than a resume, and a
        dead node ends srun by itself. The end is dated by the fault's first report, so
        however often a step is watched anew, its job is left to the step retry for at
        most WATCH_GRACE_S after that."""
        c = self.controller
        store = c.store
        nodes = set(row.nodes)
        fresh = [f for f in store.open_faults() if f.node in nodes and f.first_seen >= row.began]
        snap = Snapshot(nodes={}, jobs=[job], open_faults=fresh)
        since = now - c.config.auto_resume.fault_window_s  # open faults only here
        found = [hit for n in row.nodes if (hit := attributable(n, snap, since))]
        first = max((f.first_seen for _, f in found if f is not None), default=None)
        observe = c.config.policy.observe
        _, told = store.renew_watch(
            row.job_id, row.step_id, now, WATCH_TTL_S, None if first is None else min(first, now)
        )
        cause = "; ".join(why for why, _ in found)
        hang = self._hang(row)
        if hang is not None:  # told by the pass (its event is out): the hang ends it too
            cause = "; ".join(x for x in (cause, f"hang: {hang.cause}") if x)
        if told and observe:
            # Ending the step would change the job: told, and the step runs on.
            bad = next((f.node for _, f in found if f is not None), None)
            target = f"job {row.job_id} step {row.step_id}"
            records.would_have(store, "step_end", target, cause, now, node=bad, job_id=row.job_id)
        elif told:
            message = (
                f"step {row.step_id} of job {row.job_id} (attempt {row.attempt}) told to end "
                f"now, watched by {who}: {cause}"
            )
            store.add_event("step_end", message, now, job_id=row.job_id, cause=cause)
        end = bool(found or hang) and not observe
        return StepWatchOut(end=end, cause=cause, renew_every_s=WATCH_RENEW_S)

    # -- GET /v1/steps/retry/{id} -----------------------------------------------------
    def poll(self, who: Identity, retry_id: int) -> StepRetryOut:
        c = self.controller
        run = c.store.step_retry(retry_id)
        if run is None:
            raise Rejected(404, "not_found", f"no step retry {retry_id}")
        owner = who.node is None and who.uid >= 0 and who.uid == run.owner_uid
        if not (who.is_admin or owner):
            job = self.slurm.view(run.job_id)
            if job is None:
                raise AuthError(
                    f"{describe(who)} may only ask about its own job, not {run.job_id}", 403
                )
            may_ask(who, job)
        return step_retry_view(run, retry_backoff(c, run))


def add_step_routes(
    app: FastAPI,
    controller: Controller,
    identity: Callable[[Request], Identity],
    errors: dict[int | str, dict[str, Any]],
) -> Steps:
    ERRORS = errors  # noqa: N806 - the same name the other routes use
    steps = Steps(controller)

    async def own_job(request: Request) -> None:
        """Before the body is validated: a caller who names a job that is not theirs is
        refused on the raw JSON (the handler checks the validated body again)."""
        raw = raw_json(request)
        job_id = raw.get("job_id") if isinstance(raw, dict) else None
        if isinstance(job_id, int) and not isinstance(job_id, bool):
            steps.caller_job(identity(request), job_id)

    @app.post(
        "/v1/steps/retry",
        response_model=StepRetryOut,
        responses=ERRORS,
        dependencies=[Depends(own_job)],
    )
    def post_step_retry(body: StepFailureIn, request: Request, response: Response) -> StepRetryOut:
        """A failed ``--auto-resume`` step asks what to do: RETRYSTEP (202, a surgery
        started: poll it), REQUEUE or FAIL (200, final)."""
        out = steps.retry(identity(request), body)
        response.status_code = 202 if out.decision == "RETRYSTEP" and not out.done else 200
        return out

    @app.post(
        "/v1/steps/watch",
        response_model=StepWatchOut,
        responses=ERRORS,
        dependencies=[Depends(own_job)],
    )
    def post_step_watch(body: StepWatchIn, request: Request) -> StepWatchOut:
        """A running ``--auto-resume`` step under a step-retry helper, renewed every
        ``renew_every_s``: ``end`` when a node of it is faulty (end it now, then ask for
        its retry) rather than wait for the collective to time out."""
        return steps.watch(identity(request), body)

    @app.get("/v1/steps/retry/{retry_id}", response_model=StepRetryOut, responses=ERRORS)
    def get_step_retry(
        request: Request, retry_id: int = FastApiPath(ge=1, le=MAX_ID)
    ) -> StepRetryOut:
        """A surgery's phase; once ``done``, the new node list or REQUEUE with the cause."""
        return steps.poll(identity(request), retry_id)

    return steps
