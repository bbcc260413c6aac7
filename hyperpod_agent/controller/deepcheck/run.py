"""Deep-check runs: the Slurm side (docs/deep-checks.md).

A run moves through phases, each written to the store after its Slurm step, and every
step is safe to repeat, so a controller killed anywhere finishes the run after restart:

- ``draining`` (``--drain-first`` only): drained with our reason; waits for the jobs.
- ``reserve``: a MAINT reservation ``hyperpod-check-<id>-<created>`` on the nodes. Slurm refuses
  it while a job runs there, so a check never lands beside a user's job.
- ``resume``: drained nodes are resumed, only while their reason is still the one the
  run recorded (else somebody else decided since: the run ends, nothing touched).
  Inside the reservation no user job can start on them.
- ``submit``: one batch job of the same name, one task per node running the
  suite (``python -m hyperpod_agent.deepcheck run --out DIR``); found by name and
  owner (this controller's uid) if the controller died between ``sbatch`` and writing
  the job id. Run names are public (``GET /v1/checks``): a job of the same name that
  another user submitted is never adopted, nor cancelled.
- ``running``: until the job ends, or is cancelled at the run's deadline.
- ``restore``: every node gets its outcome's place (spare pool, service, or held with
  ``hyperpod:hold deep-check <check> <cause>``), then the reservation is deleted.

The check job's name, script and ownership are in ``job.py``; reservations no open run
owns are swept by ``orphans.py``.
"""

from __future__ import annotations

import logging
import math
import os
import pwd
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.config_deep import DeepCheckConfig
from hyperpod_agent.controller.crash import crash_from_env
from hyperpod_agent.controller.deepcheck import job as check_job
from hyperpod_agent.controller.deepcheck.orphans import ReservationSweep
from hyperpod_agent.controller.deepcheck.outcomes import (
    DRAIN_FIRST_REASON,
    judge_node,
    suite_limit_s,
    target_of,
    timed_out,
    write_script,
)
from hyperpod_agent.controller.gate import Gate, gated
from hyperpod_agent.controller.isolation import Isolation
from hyperpod_agent.controller.providers.base import SlurmApi
from hyperpod_agent.controller.store.checks import CheckRun, NodeOutcome, PhaseMoved
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.lease import Lease
from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.errors import ConfigError, SlurmError
from hyperpod_agent.slurm.models import ENDED_STATES, Job, Node

log = logging.getLogger(__name__)

ENDED = ENDED_STATES
# a cancelled job is given this long to leave before the run goes on without it
_CANCEL_GRACE_S = 60.0


# phases a run may enter and go through in the same pass (see CheckRunner._steps)
CHAINED = ("reserve", "resume", "submit")

# (node, the check it failed, cause) -> the controller replaces a node that failed re-entry
Escalate = Callable[[str, str, str], None]


class CheckRunner:
    """Advances every open run by one step per pass (never blocks on a check)."""

    def __init__(
        self,
        store: Store,
        slurm: SlurmApi | Gate,
        deep: DeepCheckConfig,
        slurm_users: Sequence[str],
        escalate: Escalate | None = None,
        isolation: Isolation | None = None,
    ) -> None:
        self.store, self.deep = store, deep
        self.slurm_users = tuple(slurm_users)
        self.slurm = gated(slurm, self.slurm_users)
        # The leader's lease while a pass runs with [ha] (phase writes are fenced).
        self.fence: Lease | None = None
        self.escalate = escalate
        self.uid = os.getuid()  # Slurm records it as the owner of the jobs we submit
        self.user = pwd.getpwuid(self.uid).pw_name
        # One run or orphan that raises is skipped, never the pass (the service
        # passes its own, which records events and quarantines).
        self.isolation = isolation or Isolation(_no_event, time.time)
        self.orphans = ReservationSweep(store, self.slurm, self.user, self.uid, self.isolation)

    def advance(self, nodes: Mapping[str, Node], jobs: Sequence[Job], now: float) -> int:
        """One step of every open run; how many changed Slurm."""
        changed = 0
        runs = self.store.open_check_runs()
        # a run's name never changes: the runs open at the start own every reservation
        # of ours that should exist, those made in this pass included
        owned = {r.reservation for r in runs}
        by_id = {j.job_id: j for j in jobs}
        for run in runs:
            changed += self.isolation.run(
                "check_run",
                run.id,
                partial(self._one_run, run, nodes, by_id, now),
                0,
                node=run.nodes[0] if len(run.nodes) == 1 else None,
            )
        self.isolation.forget_missing("check_run", {str(r.id) for r in runs})
        changed += self.orphans.sweep_if_due(owned, nodes, jobs, now)
        metrics.DEEP_CHECKS_RUNNING.set(len(self.store.open_check_runs()))
        return changed

    def _one_run(
        self, run: CheckRun, nodes: Mapping[str, Node], jobs: Mapping[int, Job], now: float
    ) -> int:
        try:
            return self._steps(run, nodes, jobs, now)
        except PhaseMoved as exc:
            log.warning("deep check run %d: %s", run.id, exc)
            return 0
        except SlurmError as exc:
            # Retried next pass; a run that cannot get its Slurm step done is ended
            # at its deadline (running) or by a later failure.
            log.warning("deep check run %d (%s): %s (retrying)", run.id, run.phase, exc)
            return 0

    def _steps(
        self, run: CheckRun, nodes: Mapping[str, Node], jobs: Mapping[int, Job], now: float
    ) -> int:
        """Step ``run`` on, through the phases this pass's view of Slurm still serves:
        reserving and submitting change no node, so the resume and the submission need
        not wait for the next pass, nor the restore after a job seen ended; a restore
        after a resume in the same pass would not see the resumed nodes."""
        changed = self._step(run, nodes, jobs, now)
        for _ in range(len(CHAINED) + 1):
            after = self.store.check_run(run.id)
            # a run that saw its job end changed no node in this pass: its restore may
            # follow at once; after a resume the view is stale, so never then
            collected = run.phase == "running" and after is not None and after.phase == "restore"
            if after is None or after.phase == run.phase:
                break
            if after.phase not in CHAINED and not collected:
                break
            run = after
            changed += self._step(run, nodes, jobs, now)
        return changed

    # -- phases ---------------------------------------------------------------------
    def _step(
        self, run: CheckRun, nodes: Mapping[str, Node], jobs: Mapping[int, Job], now: float
    ) -> int:
        missing = [n for n in run.nodes if n not in nodes]
        if missing and run.phase in ("draining", "reserve", "resume"):
            return self._fail(run, f"unknown node(s) {', '.join(missing)}", now)
        if run.phase == "draining":
            return self._draining(run, nodes, now)
        if run.phase == "reserve":
            return self._reserve(run, now)
        if run.phase == "resume":
            return self._resume(run, nodes, now)
        if run.phase == "submit":
            return self._submit(run, jobs, now)
        if run.phase == "running":
            return self._running(run, jobs, now)
        if run.phase == "restore":
            return self._restore(run, nodes, jobs, now)
        return 0

    def _draining(self, run: CheckRun, nodes: Mapping[str, Node], now: float) -> int:
        changed = 0
        for name in run.nodes:
            node = nodes[name]
            if not node.drained:
                self.slurm.drain(name, DRAIN_FIRST_REASON)
                changed += 1
            elif node.reason.strip() not in (DRAIN_FIRST_REASON, run.prior.get(name, "").strip()):
                return self._fail(run, f"{name} was drained by somebody else since", now)
        if changed:
            return changed
        if all(nodes[n].state in ("IDLE", "DOWN") for n in run.nodes):
            self._phase(run, "reserve", now)
            return 0
        if now - run.created_at > self.deep.drain_timeout_s:
            busy = [n for n in run.nodes if nodes[n].state not in ("IDLE", "DOWN")]
            why = f"still running jobs on {', '.join(busy)} after {self.deep.drain_timeout_s:g} s"
            return self._fail(run, why, now)
        return 0

    def _reserve(self, run: CheckRun, now: float) -> int:
        try:
            limit = suite_limit_s(self.deep, run.level)
        except ConfigError as exc:
            return self._fail(run, str(exc), now)
        if all(r.name != run.reservation for r in self.slurm.reservations()):
            minutes = math.ceil(limit / 60.0) * 2 + 10  # outlives the run and its restore
            try:
                self.slurm.create_maint_reservation(
                    run.reservation, run.nodes, minutes, (self.user,), seen=run.prior
                )
            except SlurmError as exc:
                return self._fail(run, f"maintenance reservation refused: {exc}", now)
            crash_from_env("deep_check:reserve")
        self._phase(
            run,
            "resume",
            now,
            events=[self._event("deep_check_reserved", run, f"reservation {run.reservation}")],
        )
        return 1

    def _resume(self, run: CheckRun, nodes: Mapping[str, Node], now: float) -> int:
        changed = 0
        for name in run.nodes:
            node = nodes[name]
            if not node.drained:
                continue
            reason = node.reason.strip()
            if reason not in (run.prior.get(name, "").strip(), DRAIN_FIRST_REASON):
                return self._fail(run, f"{name}: its reason is now {reason!r}", now)
            self.slurm.resume(name, handed=run.prior.get(name))
            changed += 1
        self._phase(run, "submit", now)
        return changed

    def _submit(self, run: CheckRun, jobs: Mapping[int, Job], now: float) -> int:
        name = run.reservation
        found = [j for j in jobs.values() if check_job.is_ours(j, name, self.uid, run.nodes)]
        limit = suite_limit_s(self.deep, run.level)
        if found:
            job_id = min(j.job_id for j in found)  # submitted before a restart
        else:
            out = self.deep.results_dir / name
            try:
                script = write_script(self.deep, name, check_job.script(run, self.deep, out))
            except (OSError, ConfigError) as exc:
                return self._fail(run, f"cannot write the check job: {exc}", now)
            try:
                job_id = self.slurm.submit_batch(
                    script,
                    job_name=name,
                    nodes=run.nodes,
                    reservation=run.reservation,
                    minutes=math.ceil(limit / 60.0) + 1,
                    output=out / "job.out",
                )
            except SlurmError as exc:
                return self._fail(run, f"check job refused: {exc}", now)
        message = f"job {job_id} running the {run.level} checks"
        self._phase(
            run,
            "running",
            now,
            job_id=job_id,
            deadline=now + limit + _CANCEL_GRACE_S,
            events=[self._event("deep_check_started", run, message)],
        )
        return 1

    def _running(self, run: CheckRun, jobs: Mapping[int, Job], now: float) -> int:
        job = jobs.get(run.job_id or -1)
        ended = job is None or job.state.upper() in ENDED
        deadline = run.deadline or now
        if not ended and now <= deadline:
            return 0
        if not ended and now <= deadline + _CANCEL_GRACE_S:
            assert run.job_id is not None
            self.slurm.cancel(run.job_id)
            log.warning(
                "deep check run %d: job %s past its deadline; cancelled", run.id, run.job_id
            )
            return 1
        outcomes = [judge_node(run, n, self.deep.results_dir, job, now) for n in run.nodes]
        if now > deadline:  # cancelled by us at the run's time limit
            outcomes = [
                o if o.outcome != "UNKNOWN" or o.check else timed_out(o, deadline - run.updated_at)
                for o in outcomes
            ]
        self._phase(run, "restore", now, outcomes=outcomes)
        return 0

    def _restore(
        self, run: CheckRun, nodes: Mapping[str, Node], jobs: Mapping[int, Job], now: float
    ) -> int:
        outcomes = {o.node: o for o in self.store.run_outcomes(run.id)}
        changed = 0
        events: list[EventIn] = []
        for name in run.nodes:
            outcome = outcomes.get(name)
            node = nodes.get(name)
            if outcome is None or node is None:
                continue
            target = target_of(run, outcome, self.slurm_users)
            changed += self._put_back(run, node, target, events)
        job = jobs.get(run.job_id or -1)
        if job is not None and job.state.upper() not in ENDED:
            self.slurm.cancel(job.job_id)  # a reservation with a job in it cannot go
        self.slurm.delete_reservation(run.reservation)
        for o in outcomes.values():
            events.append(self._outcome_event(run, o))
            metrics.DEEP_CHECKS.labels(run.purpose, o.outcome).inc()
        events.append(self._event("deep_check_done", run, f"reservation {run.reservation} removed"))
        self._phase(run, "done", now, events=events, touch_outcomes=True)
        metrics.DEEP_CHECK_SECONDS.observe(max(0.0, now - run.created_at))
        if run.purpose == "reentry" and self.escalate is not None:
            for o in outcomes.values():
                if o.ran and o.outcome == "FAIL":
                    crash_from_env("deep_check:escalate")
                    self.escalate(o.node, o.check or "-", f"deep check {o.check} FAIL: {o.cause}")
        return changed + 1

    def _put_back(
        self, run: CheckRun, node: Node, target: str | None, events: list[EventIn]
    ) -> int:
        """Give ``node`` its place after the run; never a node somebody else took since."""
        current = node.reason.strip()
        ours = {"", DRAIN_FIRST_REASON, run.prior.get(node.name, "").strip()}
        if target is not None:
            ours.add(target)
        if node.drained and current not in ours:
            events.append(
                EventIn(
                    "deep_check_left",
                    f"deep check run {run.id}: {node.name} left as it is: its reason is now "
                    f"{current!r}",
                    node.name,
                    None,
                    "changed hands",
                )
            )
            return 0
        if target is None:
            if node.drained:
                self.slurm.resume(node.name)
                return 1
            return 0
        if node.drained and current == target:
            return 0
        self.slurm.drain(node.name, target)
        return 1

    def _fail(self, run: CheckRun, why: str, now: float) -> int:
        """End a run that never reached its nodes: they go back where they were."""
        outcomes = [
            NodeOutcome(run.id, n, run.purpose, "UNKNOWN", "", why, False, now) for n in run.nodes
        ]
        self._phase(
            run,
            "restore",
            now,
            error=why,
            outcomes=outcomes,
            events=[self._event("deep_check_failed", run, why)],
        )
        log.warning("deep check run %d could not run: %s", run.id, why)
        return 0

    def _phase(self, run: CheckRun, phase: str, now: float, **fields: Any) -> None:
        """Move ``run`` on from the phase it was read in, fenced with the pass's lease:
        a deposed leader that wakes mid-run writes nothing (PhaseMoved, LeaseLost)."""
        self.store.set_check_phase(run.id, phase, now, expect=run.phase, fence=self.fence, **fields)

    # -- events ---------------------------------------------------------------------
    def _event(self, kind: str, run: CheckRun, what: str) -> EventIn:
        nodes = ",".join(run.nodes)
        node = run.nodes[0] if len(run.nodes) == 1 else None
        message = f"deep check run {run.id} ({run.purpose}, {run.level}) on {nodes}: {what}"
        return EventIn(kind, message, node, None, f"deep check {run.purpose}")

    def _outcome_event(self, run: CheckRun, o: NodeOutcome) -> EventIn:
        check = f" {o.check}" if o.check else ""
        head = f"deep check run {run.id} ({run.purpose}, {run.level})"
        message = f"{head} {o.node}: {o.outcome}{check}: {o.cause}"
        return EventIn(
            f"deep_check_{o.outcome.lower()}", message, o.node, None, f"deep check {run.purpose}"
        )


def _no_event(*_args: object, **_kwargs: object) -> None:
    """Events of a runner without the service's isolation: logged and counted only."""
