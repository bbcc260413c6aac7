"""Left-over deep-check reservations: found every ``SWEEP_EVERY_S`` and removed.

A check reservation no open run owns was left by a state database restored or started
afresh under a run. Its nodes were resumed by that run and what they were before is
lost: a node in service inside one is held, never put into service blind. Only ours
are touched: a run's whole name (``job.RUN_NAME``), made for this controller's user;
and only our check job inside one is cancelled.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial

from hyperpod_agent.controller.deepcheck.job import RUN_NAME, is_ours
from hyperpod_agent.controller.isolation import Isolation
from hyperpod_agent.controller.providers.base import SlurmApi
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.errors import SlurmError
from hyperpod_agent.reasons import Verb, format_reason
from hyperpod_agent.slurm.maint import Reservation
from hyperpod_agent.slurm.models import ENDED_STATES, Job, Node

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 600.0


class ReservationSweep:
    """Removes the check reservations no open run owns, at most every SWEEP_EVERY_S
    (again at the next pass after a failure)."""

    def __init__(
        self, store: Store, slurm: SlurmApi, user: str, uid: int, isolation: Isolation
    ) -> None:
        self.store, self.slurm = store, slurm
        self.user, self.uid = user, uid  # this controller's: what Slurm records as ours
        self.isolation = isolation
        self._swept_at = float("-inf")

    def sweep_if_due(
        self, owned: set[str], nodes: Mapping[str, Node], jobs: Sequence[Job], now: float
    ) -> int:
        """Sweep when it is time; how many changed Slurm. ``owned``: the reservations of
        the open runs."""
        if now - self._swept_at < SWEEP_EVERY_S:
            return 0
        self._swept_at = now  # a failure below asks for the next pass again
        try:
            return self.sweep(owned, nodes, jobs, now)
        except SlurmError as exc:
            self._swept_at = float("-inf")
            log.warning("deep checks: looking for left-over reservations: %s", exc)
            return 0

    def sweep(
        self, owned: set[str], nodes: Mapping[str, Node], jobs: Sequence[Job], now: float
    ) -> int:
        """Remove every check reservation of ours that no open run owns."""
        changed = 0
        reservations = self.slurm.reservations()
        for resv in reservations:
            if not RUN_NAME.fullmatch(resv.name) or resv.name in owned:
                continue
            if self.user not in resv.users:
                continue
            changed += self.isolation.run(
                "orphan",
                f"reservation {resv.name}",
                partial(self._remove, resv, nodes, jobs, now),
                0,
            )
        # forget what left Slurm meanwhile (any runner's orphans: the same universe)
        live = {f"job {j.job_id}" for j in jobs if j.state.upper() not in ENDED_STATES}
        self.isolation.forget_missing(
            "orphan", live | {f"reservation {r.name}" for r in reservations}
        )
        return changed

    def _remove(
        self, resv: Reservation, nodes: Mapping[str, Node], jobs: Sequence[Job], now: float
    ) -> int:
        why = f"left-over reservation {resv.name} removed; its state before is unknown"
        held = []
        try:
            for job in jobs:
                if is_ours(job, resv.name, self.uid) and job.state.upper() not in ENDED_STATES:
                    self.slurm.cancel(job.job_id)
            for name in resv.nodes:
                node = nodes.get(name)
                if node is not None and not node.drained and not node.reason:
                    self.slurm.drain(name, format_reason(Verb.HOLD, "deep-check", "orphan", why))
                    held.append(name)
            self.slurm.delete_reservation(resv.name)
        except SlurmError as exc:
            self._swept_at = float("-inf")  # the next pass tries again
            log.warning("deep checks: left-over reservation %s: %s (retrying)", resv.name, exc)
            return 0
        message = f"deep checks: {why}" + (f"; held {', '.join(held)}" if held else "")
        self.store.add_event("deep_check_orphan", message, now, cause="no run owns it")
        log.warning("%s", message)
        return 1
