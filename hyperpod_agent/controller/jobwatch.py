"""What the loop watches for auto-resume jobs besides Slurm: job-end notices from
EpilogSlurmctld, the ``resume.json`` markers the checkpoint library writes and the
steps taken around a restart (controller/stepmarks.py)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from hyperpod_agent.controller.autoresume import cap_of
from hyperpod_agent.controller.resume_marker import (
    MarkerError,
    marker_path,
    parse_marker,
    read_marker,
    stat_marker,
)
from hyperpod_agent.controller.snapshot import Snapshot, speaks_for
from hyperpod_agent.controller.stepmarks import StepMarks
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.health import JobProgress
from hyperpod_agent.slurm.models import Job

log = logging.getLogger(__name__)

# EpilogSlurmctld runs while the job still shows COMPLETING, so the pass its notice
# wakes sees no end yet: the loop looks again every FOLLOW_UP_S until Slurm shows the
# job's final state (or FOLLOW_UP_FOR_S have passed).
FOLLOW_UP_S = 0.5
FOLLOW_UP_FOR_S = 30.0
UNSETTLED = ("RUNNING", "COMPLETING")


class JobWatch:
    """Job-end follow-ups (thread-safe: the API adds, the loop settles) and markers."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._ending: dict[int, float] = {}  # job id -> follow up until
        self._markers: dict[int, float] = {}  # job id -> mtime of the resume.json last read
        self.steps = StepMarks()

    # -- job-end notices ------------------------------------------------------------
    def follow(self, job_id: int, now: float) -> None:
        """A job-end notice: look again soon until Slurm shows the end."""
        with self._lock:
            self._ending[job_id] = now + FOLLOW_UP_FOR_S

    def settle(self, jobs: Sequence[Job], now: float) -> None:
        """Stop following jobs whose end Slurm now shows, or that we followed long enough."""
        states = {j.job_id: j.state.upper() for j in jobs}
        with self._lock:
            self._ending = {
                job_id: until
                for job_id, until in self._ending.items()
                if until > now and states.get(job_id, "") in UNSETTLED
            }

    def following(self) -> set[int]:
        with self._lock:
            return set(self._ending)

    def wait(self, interval: float) -> float:
        """Seconds until the next pass: short while a notified end is not visible yet."""
        with self._lock:
            return min(FOLLOW_UP_S, interval) if self._ending else interval

    # -- resume.json ----------------------------------------------------------------
    def read_markers(self, snap: Snapshot, root: Path, default_attempts: int, now: float) -> None:
        """``resumed_from_step`` of running auto-resume jobs, from their resume.json.

        Cheap: one lstat per running tracked job; the file is read only when its mtime
        changed. A bad file is logged once (per mtime) and never stops the pass. The
        ranks' progress is followed around each restart (stepmarks.py).
        """
        progress = trusted_progress(snap)
        self.steps.record(progress, now)
        running = [
            j.job_id
            for j in snap.jobs
            if j.state.upper() == "RUNNING"
            and (j.job_id in snap.tracked or cap_of(j, snap, default_attempts) is not None)
        ]
        self._markers = {k: v for k, v in self._markers.items() if k in running}
        for job_id in running:
            path = marker_path(root, job_id)
            mtime = stat_marker(path)
            if mtime is None or self._markers.get(job_id) == mtime:
                continue
            self._markers[job_id] = mtime
            try:
                self._read_marker(job_id, path, mtime, now)
            except (OSError, MarkerError) as exc:
                log.warning("job %d: ignoring %s: %s", job_id, path, exc)
            except Exception:  # noqa: BLE001 - one job's file never stops the pass
                log.exception("job %d: reading %s failed; ignoring it", job_id, path)
        for event in self.steps.first_steps(progress, now):
            self.store.add_event(
                event.kind, event.message, now, job_id=event.job_id, cause=event.cause
            )

    def _read_marker(self, job_id: int, path: Path, mtime: float, now: float) -> None:
        """Record the step ``job_id`` resumed from, with its event, in one transaction:
        the event says the highest step the job had reached before (when seen)."""
        marker = parse_marker(read_marker(path), job_id)
        current = self.store.job(job_id)
        if current is None or current.resumed_from_step == marker.step:
            return
        restart = f" (restart {marker.restart_count})" if marker.restart_count is not None else ""
        message = f"job {job_id} resumed from step {marker.step}{restart}"
        # Written when the job restored (any user can set a file's mtime: bounded by now).
        restored_at = min(mtime, now)
        reached = self.steps.reached_before(job_id, restored_at)
        if reached is not None:
            message += f"; it had reached step {reached}"
        self.steps.expect_first_step(job_id, marker.step, restored_at, now)
        self.store.upsert_job(
            dataclasses.replace(current, resumed_from_step=marker.step, updated_at=now),
            [EventIn("resumed", message, job_id=job_id, cause=str(path))],
            now,
        )


def trusted_progress(snap: Snapshot) -> list[JobProgress]:
    """The progress records that speak for their job (as the hang judgement reads them)."""
    jobs = {j.job_id: j for j in snap.jobs}
    return [
        jp
        for name, health in snap.health.items()
        for jp in health.progress
        if (job := jobs.get(jp.job_id)) is not None and speaks_for(job, name, jp)
    ]
