"""The goodput routes, ``GET /v1/goodput`` (the cluster) and ``GET /v1/jobs/{id}/goodput``,
and the goodput gauges, refreshed when ``/metrics`` is scraped.

Here are the reads: the event log, the requeues the controller made, Slurm's view of
the last pass and the ranks' progress from the agents' latest reports. The computation
is controller/goodput/, without I/O.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import FastAPI, Query, Request
from fastapi import Path as FastApiPath
from starlette.exceptions import HTTPException as StarletteHTTPException

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.api import views
from hyperpod_agent.controller.api.callers import identity_of
from hyperpod_agent.controller.api.models import ERRORS, MAX_INT64
from hyperpod_agent.controller.gather import _progress as stored_progress
from hyperpod_agent.controller.goodput import (
    ClusterGoodput,
    JobGoodput,
    ProgressMark,
    cluster_goodput,
    job_goodput,
)
from hyperpod_agent.controller.goodput.incidents import LOOKBACK_S
from hyperpod_agent.controller.goodput.records import job_record, progress_marks
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import EventRow

if TYPE_CHECKING:
    from hyperpod_agent.controller.service import Controller

log = logging.getLogger(__name__)

PAGE = 1000
# The most events one read of the log takes (memory and time of one answer); past it the
# answer says so in its limits.
MAX_EVENTS = 50_000
# The gauges: over the last day, computed at most once a minute however often scraped.
METRICS_WINDOW_S = 86_400.0
METRICS_EVERY_S = 60.0
SINCE = Query(
    default=None,
    max_length=64,
    description="only time after this ISO 8601 time (UTC when it names no zone)",
)


def add_goodput_routes(app: FastAPI, controller: Controller) -> None:
    """Register the goodput routes on ``app`` (any authenticated caller, as the other
    reads)."""

    @app.get("/v1/goodput", response_model=ClusterGoodput, responses=ERRORS)
    def goodput(request: Request, since: str | None = SINCE) -> ClusterGoodput:
        """Every job the controller looks after, and their sum weighted by nodes."""
        identity_of(request)
        now = controller.clock()
        return cluster_of(controller, now, _since(since, now))

    @app.get("/v1/jobs/{job_id}/goodput", response_model=JobGoodput, responses=ERRORS)
    def job(
        request: Request,
        job_id: int = FastApiPath(ge=1, le=MAX_INT64),
        since: str | None = SINCE,
    ) -> JobGoodput:
        """One job's goodput; 404 when no record names the job."""
        identity_of(request)
        now = controller.clock()
        found = job_of(controller, job_id, now, _since(since, now))
        if found is None:
            raise StarletteHTTPException(
                404, f"job {job_id}: no record of it (not in Slurm's view, no event, no progress)"
            )
        return found


def _since(value: str | None, now: float) -> float | None:
    if value is None:
        return None
    when = views.iso_time(value, "since")
    if when > now:
        raise views.invalid("since", f"{value!r} is in the future")
    return when


def job_of(
    controller: Controller, job_id: int, now: float, since: float | None
) -> JobGoodput | None:
    """``job_id``'s goodput, or None when nothing names the job."""
    store = controller.store
    slurm = next((j for j in controller.jobs if j.job_id == job_id), None)
    own = read_events(store, 0.0, job_id=job_id)
    marks = [m for m in _marks(store) if m.job_id == job_id]
    if slurm is None and not own and not marks:
        return None
    record = job_record(job_id, slurm, store.job_actions(job_id))
    # The nodes' events from a little before the job's first record (its fault).
    first = min([e.at for e in own] + [record.started_at or now])
    begin = max(0.0, max(first, since or 0.0) - LOOKBACK_S)
    nodes = record.nodes | {e.node for e in own if e.node}
    reads = [own] + [read_events(store, begin, node=n) for n in sorted(nodes)]
    events = list({e.id: e for read in reads for e in read}.values())
    return _noted(job_goodput(record, events, marks, now, since), reads)


def cluster_of(controller: Controller, now: float, since: float | None) -> ClusterGoodput:
    """Every job the controller looks after: the auto-resume jobs it tracks, the jobs
    whose steps it retried, those whose ranks report progress and those its events name."""
    store = controller.store
    events = read_events(store, 0.0 if since is None else max(0.0, since - LOOKBACK_S))
    marks = _marks(store)
    ids = set(store.jobs()) | set(store.step_retry_jobs(limit=10_000))
    ids |= {m.job_id for m in marks} | {e.job_id for e in events if e.job_id is not None}
    slurm = {j.job_id: j for j in controller.jobs}
    jobs = [job_record(i, slurm.get(i), store.job_actions(i)) for i in sorted(ids)]
    return _noted(cluster_goodput(jobs, events, marks, now, since), [events])


Answer = TypeVar("Answer", JobGoodput, ClusterGoodput)


def _noted(answer: Answer, reads: list[list[EventRow]]) -> Answer:
    """``answer``, saying so when a read of the event log stopped at ``MAX_EVENTS``."""
    if all(len(r) < MAX_EVENTS for r in reads):
        return answer
    cut = f"the event log holds more than {MAX_EVENTS} events in the window: the rest was not read"
    return answer.model_copy(update={"limits": [*answer.limits, cut]})


def read_events(store: Store, since_at: float, **match: Any) -> list[EventRow]:
    """Events after ``since_at`` (epoch s), oldest first, page by page, at most
    ``MAX_EVENTS``. ``match``: the store's filters (``node``, ``job_id``)."""
    out: list[EventRow] = []
    last = 0
    while len(out) < MAX_EVENTS:
        page = store.events(last, limit=PAGE, since_at=since_at, **match)
        out += page[: MAX_EVENTS - len(out)]
        if len(page) < PAGE:
            break
        last = page[-1].id
    return out


def _marks(store: Store) -> list[ProgressMark]:
    """The ranks' progress from every node's latest report, read as the pass reads it
    (gather's reader: a row it cannot read is skipped, and logged)."""
    rows = store.node_rows().values()
    return progress_marks((r.received_at or 0.0, stored_progress(r)) for r in rows)


class GoodputGauges:
    """The goodput gauges of the last day, computed again at most every
    ``METRICS_EVERY_S`` when ``/metrics`` is scraped (nothing runs between scrapes)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self._lock = threading.Lock()
        self._at: float | None = None

    def refresh(self) -> None:
        now = self.controller.clock()
        with self._lock:
            if self._at is not None and now - self._at < METRICS_EVERY_S:
                return
            self._at = now
            t0 = time.monotonic()
            try:
                result = cluster_of(self.controller, now, now - METRICS_WINDOW_S)
            except Exception:  # noqa: BLE001 - the scrape still answers: success says 0
                log.exception("goodput gauges: computing the last day's goodput failed")
                metrics.GOODPUT_SUCCESS.set(0)
            else:
                metrics.set_goodput(result, now)
                metrics.GOODPUT_SUCCESS.set(1)
            metrics.GOODPUT_SECONDS.set(time.monotonic() - t0)
