"""Left-over helper allocations and spare reservations of step retries, removed.

A surgery makes a helper allocation ``hyperpod-expand-J`` (and a reservation of that
name on the spare). One no open surgery owns was left by a surgery that ended, or whose
job ended: the helper is cancelled every pass, in the pass's own view of the jobs; the
reservations are looked for every ``SWEEP_EVERY_S`` (and at the next pass after a
delete that failed). Only ours: a whole name we make (``expansion_parent``) and, for a
job, this controller's uid as Slurm records its owner; for a reservation, this
controller's user among those it admits. Any user may name a job like ours, and such a
job is never adopted nor cancelled.
"""

from __future__ import annotations

import logging
import os
import pwd
from collections.abc import Callable, Sequence
from functools import partial

from hyperpod_agent.controller.isolation import Isolation
from hyperpod_agent.controller.providers.base import SlurmApi
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.errors import SlurmError
from hyperpod_agent.slurm.maint import Reservation
from hyperpod_agent.slurm.models import ENDED_STATES, Job
from hyperpod_agent.slurm.resize import expansion_parent

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 600.0


def me() -> str:
    """Who runs this controller: the user the spare's reservation admits (the helper
    allocation is ours)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return "root"


class HelperSweep:
    """Cancels our helper allocations and deletes our spare reservations that no open
    surgery owns. ``ours``: is a job one this controller made (its uid)."""

    def __init__(
        self, store: Store, slurm: SlurmApi, ours: Callable[[Job], bool], isolation: Isolation
    ) -> None:
        self.store, self.slurm, self.ours, self.isolation = store, slurm, ours, isolation
        self._swept_at = float("-inf")  # reservations: at the first pass, then rarely

    def soon(self) -> None:
        """Look for left-over reservations at the next pass (a delete that failed)."""
        self._swept_at = float("-inf")

    def sweep(
        self, now: float, jobs: Sequence[Job] | None = None, owned: set[int] | None = None
    ) -> int:
        """Cancel our helper allocations no open surgery owns (``owned``: their jobs'
        ids, read here when not given), and, every SWEEP_EVERY_S, delete the spare
        reservations of the same name no open surgery owns. ``jobs``: the pass's view
        of Slurm's jobs (read here when not given)."""
        if owned is None:
            owned = {r.job_id for r in self.store.open_step_retries()}
        by_id = {j.job_id: j for j in (self.slurm.list_jobs() if jobs is None else jobs)}
        cancelled = 0
        for job in by_id.values():
            parent_id = expansion_parent(job.name)
            if parent_id is None or not self.ours(job) or job.state.upper() in ENDED_STATES:
                continue
            parent = by_id.get(parent_id)
            if parent is not None and parent.job_id in owned and parent.state == "RUNNING":
                continue
            cancelled += self.isolation.run(
                "orphan",
                f"job {job.job_id}",
                partial(self._cancel_helper, job, parent, now),
                0,
                job_id=job.job_id,
            )
        if now - self._swept_at < SWEEP_EVERY_S:
            return cancelled
        self._swept_at = now
        reservations = self.slurm.reservations()
        for resv in reservations:
            parent_id = expansion_parent(resv.name)
            if parent_id is None or parent_id in owned or me() not in resv.users:
                continue
            cancelled += self.isolation.run(
                "orphan", f"reservation {resv.name}", partial(self._delete, resv, now), 0
            )
        # forget what left Slurm meanwhile (any runner's orphans: the same universe)
        live = {f"job {j.job_id}" for j in by_id.values() if j.state.upper() not in ENDED_STATES}
        self.isolation.forget_missing(
            "orphan", live | {f"reservation {r.name}" for r in reservations}
        )
        return cancelled

    def _cancel_helper(self, job: Job, parent: Job | None, now: float) -> int:
        try:
            self.slurm.cancel(job.job_id)
        except SlurmError as exc:
            log.warning("step retry: helper allocation %d: %s (retrying)", job.job_id, exc)
            return 0
        why = "its job ended" if parent is None or parent.state != "RUNNING" else "no surgery"
        message = f"step retry: helper allocation {job.job_id} ({job.name}) cancelled: {why}"
        self.store.add_event("step_retry_orphan", message, now, cause=why)
        log.warning("%s", message)
        return 1

    def _delete(self, resv: Reservation, now: float) -> int:
        try:
            if not self.slurm.delete_reservation(resv.name):
                return 0
        except SlurmError as exc:
            log.warning("step retry: reservation %s: %s (retrying)", resv.name, exc)
            self.soon()
            return 0
        message = f"step retry: reservation {resv.name} deleted: no surgery owns it"
        self.store.add_event("step_retry_orphan", message, now, cause="no surgery")
        log.warning("%s", message)
        return 1
