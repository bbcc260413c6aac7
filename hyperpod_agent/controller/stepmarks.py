"""The steps a job took around its restarts, kept while it runs so its goodput can be
counted after it ended: the agents report each rank's latest step only, and an ended
job's ranks are no longer reported at all.

Two records reach the event log: the highest step a job had reached before a restart
(in its ``resumed`` event, controller/jobwatch.py) and, once the ranks report a step
past the one restored, a ``first_new_step`` event with when that step finished. The
goodput computation (controller/goodput/incidents.py) reads both. Memory only: after a
controller restart the records of the jobs running then are not written (the goodput
says what it does not know).
"""

from __future__ import annotations

import json
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.health import JobProgress

HISTORY = 64  # rises of a job's highest step kept (only the last ones before a restart count)
DURATIONS = 32  # step durations kept per job, for the median
MAX_JOBS = 4096  # jobs followed at once (the oldest seen is forgotten first)
FORGET_S = 3600.0  # a job no rank reported for this long is forgotten
WAIT_FOR_S = 3600.0  # how long a restart's first new step is waited for


@dataclass
class _Job:
    seen: float
    # (highest step, when it finished), each time that pair changed
    steps: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=DURATIONS))
    # (step restored, when it was restored, since when waited) for the first new step
    waiting: tuple[int, float, float] | None = None


@dataclass(frozen=True)
class _Rank:
    step: int
    step_at: float
    last_s: float | None


class StepMarks:
    """Per job, the rises of its highest step and a restart's wait for its first step."""

    def __init__(self) -> None:
        self._jobs: dict[int, _Job] = {}

    def record(self, progress: Iterable[JobProgress], now: float) -> None:
        """One pass's progress (every node's latest report)."""
        for job_id, ranks in _by_job(progress).items():
            job = self._jobs.get(job_id) or _Job(seen=now)
            self._jobs[job_id] = job
            job.seen = now
            top = max((r.step, r.step_at) for r in ranks)
            if not job.steps or job.steps[-1] != top:
                job.steps.append(top)
                job.durations.extend(r.last_s for r in ranks if r.last_s)
        self._forget(now)

    def reached_before(self, job_id: int, when: float) -> int | None:
        """The highest step ``job_id`` finished before ``when``, if it was seen."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        return max((s for s, at in job.steps if at < when), default=None)

    def expect_first_step(self, job_id: int, restored: int, since: float, now: float) -> None:
        """``job_id`` restored step ``restored`` at ``since``: its next step is its first new."""
        job = self._jobs.get(job_id) or _Job(seen=now)
        self._jobs[job_id] = job
        job.waiting = (restored, since, now)

    def first_steps(self, progress: Iterable[JobProgress], now: float) -> list[EventIn]:
        """The ``first_new_step`` events of the restarts whose ranks now report a step
        past the one restored. A step further on than the first is taken back to when
        the first finished at the ranks' step duration."""
        out = []
        for job_id, ranks in _by_job(progress).items():
            job = self._jobs.get(job_id)
            if job is None or job.waiting is None:
                continue
            restored, since, _ = job.waiting
            new = [r for r in ranks if r.step > restored and r.step_at >= since]
            if not new:
                continue
            first = min(new, key=lambda r: (r.step, r.step_at))
            step_s = self._step_s(job)
            at = first.step_at - (first.step - restored - 1) * (step_s or 0.0)
            at = max(since, at)
            job.waiting = None
            cause: dict[str, float] = {
                "step": restored + 1,
                "at": round(at, 3),
                "seen_step": first.step,
            }
            if step_s is not None:
                cause["step_s"] = round(step_s, 4)
            message = f"job {job_id} took step {restored + 1}, its first since step {restored}"
            out.append(EventIn("first_new_step", message, job_id=job_id, cause=json.dumps(cause)))
        return out

    @staticmethod
    def _step_s(job: _Job) -> float | None:
        return statistics.median(job.durations) if job.durations else None

    def _forget(self, now: float) -> None:
        for job_id, job in list(self._jobs.items()):
            if job.waiting is not None and now - job.waiting[2] > WAIT_FOR_S:
                job.waiting = None
            if now - job.seen > FORGET_S and job.waiting is None:
                del self._jobs[job_id]
        if len(self._jobs) > MAX_JOBS:
            oldest = sorted(self._jobs, key=lambda j: self._jobs[j].seen)
            for job_id in oldest[: len(self._jobs) - MAX_JOBS]:
                del self._jobs[job_id]


def _by_job(progress: Iterable[JobProgress]) -> dict[int, list[_Rank]]:
    """Each job's ranks that finished a step, over every node's report."""
    out: dict[int, list[_Rank]] = {}
    for jp in progress:
        for r in jp.ranks:
            if r.step >= 0 and r.step_at is not None:
                out.setdefault(jp.job_id, []).append(_Rank(r.step, r.step_at, r.last_s))
    return out
