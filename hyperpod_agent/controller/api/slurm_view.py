"""A job as the step routes see it: who may ask about it, when it started, and Slurm
read for it (the last pass's view, or a read of their own shared by every caller for
``FRESH_S``). Only a caller found allowed causes a read."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hyperpod_agent.auth.config import AuthError, Identity, describe
from hyperpod_agent.controller.ingest import Rejected
from hyperpod_agent.errors import SlurmError
from hyperpod_agent.slurm.models import Job, Node

if TYPE_CHECKING:
    from hyperpod_agent.controller.service import Controller

# One Slurm read serves every step request for this long, whoever asks.
FRESH_S = 1.0


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


def started(job: Job) -> float:
    """When the job started, as Slurm says (0 when it does not)."""
    return job.start_time.timestamp() if job.start_time is not None else 0.0


class SlurmReads:
    """Slurm as the step routes see it: the last pass's read, or one of their own, shared
    by every caller for ``FRESH_S`` and never older than ``not_before``."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self._lock = threading.Lock()
        self._at: float | None = None
        self._nodes: Mapping[str, Node] = {}
        self._jobs: dict[int, Job] = {}
        self._index: tuple[list[Job], dict[int, Job]] = ([], {})

    def view(self, job_id: int) -> Job | None:
        """The job as the last pass saw it (a dictionary lookup; the index is rebuilt
        once per pass)."""
        jobs = self.controller.jobs
        index = self._index
        if index[0] is not jobs:
            index = (jobs, {j.job_id: j for j in jobs})
            self._index = index
        return index[1].get(job_id)

    def view_since(self, when: float) -> bool:
        """Whether the last pass read Slurm after ``when``."""
        passed = self.controller.last_pass_at
        return passed is not None and passed > when

    def read(self, not_before: float) -> tuple[Mapping[str, Node], dict[int, Job]]:
        c = self.controller
        with self._lock:  # one read at a time: callers meanwhile share it
            now = c.clock()
            oldest = max(now - FRESH_S, not_before)
            if self._at is not None and self._at >= oldest:
                return self._nodes, self._jobs
            passed = c.last_pass_at
            if passed is not None and passed >= oldest:
                # the pass read Slurm after it began: recent enough
                nodes, jobs = c.nodes, c.jobs
                self._at = passed
            else:
                try:
                    nodes = {n.name: n for n in c.slurm.list_nodes()}
                    jobs = c.slurm.list_jobs()
                except SlurmError as exc:
                    raise Rejected(503, "slurm_unavailable", f"cannot read Slurm: {exc}") from exc
                self._at = now
            self._nodes, self._jobs = nodes, {j.job_id: j for j in jobs}
            return self._nodes, self._jobs
