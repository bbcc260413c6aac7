"""Step retry surgery: the Slurm side (docs/auto-resume.md, "Step retry inside the
allocation").

A surgery moves through phases, each written to the store after its Slurm step, and
every step is safe to repeat, so a controller killed anywhere finishes the surgery or
rolls it back after restart:

- ``drain``: the bad node is drained with the replace path's reason
  (``hyperpod:replace <component> <code> <message>``): held for repair from then on,
  handled by the policy as any replaced node (never resumed by itself, lemon counting).
- ``shrink``: the job keeps its other nodes (``scontrol update jobid=J NodeList=...``);
  a bad batch host stays (Slurm never removes one), drained, no step of the job on it.
- ``expand``: the spare leaves the pool (resumed, as the replace path does) and a helper
  allocation ``hyperpod-expand-J`` is made on it. A controller that died while ``salloc``
  waited finds the helper by name and owner (its own uid): a running one is adopted, a
  pending one cancelled and asked for again.
- ``absorb``: the helper's node is merged into the job; the job read back must hold it.
- ``done``: RETRYSTEP with the job's new node list; the helper, now without nodes, is
  cancelled and the bad node recorded as replaced by the spare.

Any failure before the spare is in the job goes to ``rollback``: the helper is
cancelled, the spare goes back to the pool and the job is requeued (REQUEUE): a job
that was shrunk has lost a node its step needs, and one not yet shrunk still holds the
faulty node; either way only a fresh allocation runs the step again. The bad node stays
out: it is faulty.

Helper allocations and spare reservations no open surgery owns are removed by
``orphans.py``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.gate import Gate, Refused, gated
from hyperpod_agent.controller.isolation import Isolation
from hyperpod_agent.controller.providers.base import SlurmApi
from hyperpod_agent.controller.stepretry.orphans import HelperSweep, me
from hyperpod_agent.controller.store.checks import PhaseMoved
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.lease import Lease
from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.controller.store.steps import StepRetry
from hyperpod_agent.errors import SlurmError
from hyperpod_agent.health import Action
from hyperpod_agent.reasons import SPARE, Owner, owner_of
from hyperpod_agent.slurm.models import ENDED_STATES, Job, Node
from hyperpod_agent.slurm.resize import expansion_parent

log = logging.getLogger(__name__)

ENDED = ENDED_STATES
STEPS = ("drain", "shrink", "expand", "absorb")
# The spare's reservation outlives the allocation wait by this much, so one a crash
# left behind expires by itself even if no controller deletes it.
RESERVATION_SLACK_MIN = 10
READ_BACK_TRIES, READ_BACK_PAUSE_S = 8, 0.25
RESPONDING_TRIES = 40  # 10 s at READ_BACK_PAUSE_S


class SurgeryFailed(Exception):
    """A phase that cannot be done: the surgery rolls back with this cause."""


class StepRetryRunner:
    """Takes every open surgery as far as it goes in one pass (the step waits on it).

    A helper allocation or spare reservation is ours only when its whole name is one
    we make (``hyperpod-expand-<digits>``) and, for a job, Slurm records this
    controller's uid as its owner: any user may name a job like ours, and such a job
    is never adopted nor cancelled."""

    def __init__(
        self,
        store: Store,
        slurm: SlurmApi | Gate,
        config: ControllerConfig,
        crash_hook: Callable[[str], None] | None = None,
        timer: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        isolation: Isolation | None = None,
    ) -> None:
        self.store, self.config = store, config
        self.slurm = gated(slurm, (config.slurm_user,))
        # The leader's lease while a pass runs with [ha]: phase writes are fenced with
        # it and compare-and-set on the phase, so a deposed leader that wakes mid-surgery
        # writes nothing over what the new leader did.
        self.fence: Lease | None = None
        # Test-only: called after each Slurm step, before its phase is written.
        self._crash_hook = crash_hook or (lambda point: None)
        self._timer = timer
        self._sleep = sleep
        # One surgery or orphan that raises is skipped, never the pass (the service
        # passes its own, which records events and quarantines).
        self.isolation = isolation or Isolation(_no_event, time.time)
        self.uid = os.getuid()  # what Slurm records as the owner of the jobs we make
        self.orphans = HelperSweep(store, self.slurm, self.ours, self.isolation)

    def ours(self, job: Job) -> bool:
        """A job this controller made (its uid as Slurm records it)."""
        return job.uid is not None and job.uid == self.uid

    def advance(self, now: float, jobs: Sequence[Job] | None = None) -> int:
        """The helper allocations and reservations nobody owns are removed, then every
        open surgery goes through as many phases as Slurm allows. ``jobs``: the pass's
        view of Slurm's jobs (read here when not given). How many changed Slurm."""
        runs = self.store.open_step_retries()
        changed = 0
        try:
            changed += self.orphans.sweep(now, jobs, {r.job_id for r in runs})
        except SlurmError as exc:
            log.warning("step retry: looking for left-over helper allocations: %s", exc)
        for run in runs:
            changed += self.isolation.run(
                "surgery",
                run.id,
                partial(self._one_surgery, run, now),
                0,
                node=run.bad_node,
                job_id=run.job_id,
            )
        self.isolation.forget_missing("surgery", {str(r.id) for r in runs})
        return changed

    def _one_surgery(self, run: StepRetry, now: float) -> int:
        try:
            return 1 if self._surgery(run, now) else 0
        except PhaseMoved as exc:
            log.warning("step retry %d: %s", run.id, exc)
            return 0
        except SlurmError as exc:
            # Reading Slurm failed, or a rollback step did: the next pass goes on
            # from the phase the store has.
            log.warning("step retry %d (%s): %s (retrying)", run.id, run.phase, exc)
            return 0

    # -- the phases -----------------------------------------------------------------
    def _surgery(self, run: StepRetry, now: float) -> int:
        changed = 0
        for _ in range(len(STEPS) + 1):
            if run.phase == "rollback":
                return changed + self._rollback(run, now)
            if run.phase not in STEPS:
                return changed
            started = self._timer()
            try:
                update = self._step(run)
            except (SurgeryFailed, SlurmError) as exc:
                self._fail(run, str(exc).splitlines()[0] if str(exc) else type(exc).__name__, now)
            else:
                self._crash_hook(run.phase)
                self._advanced(run, update, self._timer() - started, now)
            changed += 1
            after = self.store.step_retry(run.id)
            if after is None:
                return changed
            run = after
        return changed

    def _step(self, run: StepRetry) -> dict[str, Any]:
        """Do ``run``'s phase in Slurm (a no-op when a crash left it done); what it
        learnt for the store."""
        nodes = {n.name: n for n in self.slurm.list_nodes()}
        jobs = {j.job_id: j for j in self.slurm.list_jobs()}
        job = jobs.get(run.job_id)
        if job is None or job.state.upper() != "RUNNING":
            raise SurgeryFailed(f"job {run.job_id} is {job.state if job else 'gone'}")
        if run.phase == "drain":
            self._drain(run, nodes)
            return {}
        if run.phase == "shrink":
            # A bad batch host is kept (Slurm never removes one): nothing to shrink.
            if run.bad_node in job.nodes and run.bad_node not in run.keep:
                self.slurm.shrink_job(run.job_id, run.keep)
            return {}
        if run.phase in ("expand", "absorb"):
            self._no_other_fault(run, job)
        if run.phase == "expand":
            return {"helper_id": self._expand(run, nodes, jobs)}
        return {"new_nodes": self._absorb(run, jobs)}

    def _no_other_fault(self, run: StepRetry, job: Job) -> None:
        """Two faults within a second reach the controller a report apart: a node the
        step would run on again, faulty since its job started, fails the retry at once.
        Seen before the spare joins, it is one requeue naming both, not a retry then a
        requeue."""
        began = job.start_time.timestamp() if job.start_time is not None else 0.0
        others = set(run.keep) - {run.bad_node}
        for f in self.store.open_faults():
            serious = Action(f.action).rank >= Action.RESET.rank
            if f.node in others and serious and f.first_seen >= began:
                raise SurgeryFailed(
                    f"{f.component} {f.code} on {f.node} too: one retry replaces one node"
                )

    def _drain(self, run: StepRetry, nodes: dict[str, Node]) -> None:
        node = nodes.get(run.bad_node)
        if node is None:
            raise SurgeryFailed(f"{run.bad_node} is no longer in Slurm")
        if node.drained and node.reason.strip() == run.reason.strip():
            return
        if owner_of(node, (self.config.slurm_user,)) in (Owner.OTHER, Owner.REQUEST):
            raise SurgeryFailed(f"{run.bad_node} was taken since: its reason is {node.reason!r}")
        self.slurm.drain(run.bad_node, run.reason)

    def _expand(self, run: StepRetry, nodes: dict[str, Node], jobs: dict[int, Job]) -> int:
        helpers = [j for j in jobs.values() if self._helper_of(run, j)]
        for helper in helpers:
            if helper.state.upper() == "RUNNING" and helper.nodes == (run.spare,):
                return helper.job_id  # made before a restart
        for helper in helpers:  # a salloc that died waiting; ask again
            self.slurm.cancel(helper.job_id)
        spare = nodes.get(run.spare)
        if spare is None:
            raise SurgeryFailed(f"spare {run.spare} is no longer in Slurm")
        wait = self.config.auto_resume.step_retry_wait_s
        held = any(r.name == run.helper_name for r in self.slurm.reservations())
        if spare.reason.strip() == SPARE:
            # Held for this job first: a job waiting for nodes would otherwise take the
            # spare between its resume and the helper allocation (Slurm schedules on
            # the resume), and the retry would wait for that job to end.
            if not held:
                minutes = int(wait // 60) + RESERVATION_SLACK_MIN
                self.slurm.create_maint_reservation(run.helper_name, [run.spare], minutes, [me()])
                held = True
            self.slurm.resume(run.spare)  # leaves the pool, as the replace path does
            self._until_responding(run.spare)
        elif spare.drained:
            raise SurgeryFailed(
                f"spare {run.spare} was taken since: its reason is {spare.reason!r}"
            )
        reservation = run.helper_name if held else None
        return self.slurm.allocate_expansion(run.job_id, run.spare, wait, reservation)

    def _helper_of(self, run: StepRetry, job: Job) -> bool:
        """``job`` is a live helper allocation we made for ``run``."""
        return (
            expansion_parent(job.name) == run.job_id
            and self.ours(job)
            and job.state.upper() not in ENDED
        )

    def _until_responding(self, name: str) -> None:
        """Slurm flags a node it has just resumed NOT_RESPONDING until its next ping. An
        allocation asked for meanwhile misses the scheduling its submission triggers
        and waits for the periodic one (sched_interval, 60 s by default): wait, within
        a few seconds, for the node to answer first."""
        for _ in range(RESPONDING_TRIES):
            if self.slurm.node(name).responding:
                return
            self._sleep(READ_BACK_PAUSE_S)

    def _absorb(self, run: StepRetry, jobs: dict[int, Job]) -> list[str]:
        job = jobs[run.job_id]
        if run.spare not in job.nodes:
            helper = jobs.get(run.helper_id or -1)
            if helper is None or helper.state.upper() != "RUNNING":
                raise SurgeryFailed(f"helper allocation {run.helper_id} is gone")
            self.slurm.absorb_expansion(run.job_id, helper.job_id)
            # scontrol's exit status says little here (Slurm's noise, a lookup not
            # waited for): read the job back, a few times within a second or two
            for _ in range(READ_BACK_TRIES):
                job = next((j for j in self.slurm.list_jobs() if j.job_id == run.job_id), job)
                if run.spare in job.nodes:
                    break
                self._sleep(READ_BACK_PAUSE_S)
            if run.spare not in job.nodes:
                raise SurgeryFailed(f"job {run.job_id} does not hold {run.spare} after the merge")
        helper = jobs.get(run.helper_id or -1)
        if helper is not None and helper.state.upper() not in ENDED:
            self.slurm.cancel(helper.job_id)  # without nodes now: nothing of the job's goes
        self._unreserve(run)  # the spare is the job's now
        return list(job.nodes)

    def _unreserve(self, run: StepRetry) -> None:
        """Delete the spare's reservation; a failure (the helper still completing) is
        left to the orphan sweep of a later pass, never fails the surgery."""
        try:
            self.slurm.delete_reservation(run.helper_name)
        except SlurmError as exc:
            log.info("step retry %d: reservation %s kept for now: %s", run.id, run.helper_name, exc)
            self.orphans.soon()  # the next pass's sweep deletes it

    # -- bookkeeping ----------------------------------------------------------------
    def _advanced(self, run: StepRetry, update: dict[str, Any], took: float, now: float) -> None:
        nxt = STEPS[STEPS.index(run.phase) + 1] if run.phase != "absorb" else "done"
        metrics.STEP_RETRY_PHASE_SECONDS.labels(run.phase).observe(max(0.0, took))
        what = {
            "drain": f"{run.bad_node} drained ({run.reason})",
            "shrink": (
                f"{run.bad_node} kept as the batch host only"
                if run.bad_node in run.keep
                else f"job shrunk to {','.join(run.keep)}"
            ),
            "expand": f"helper allocation {update.get('helper_id')} on {run.spare}",
            "absorb": f"{run.spare} merged into the job",
        }[run.phase]
        events = [self._event(f"step_retry_{run.phase}", run, f"{what} in {took:.2f} s")]
        actions: list[dict[str, Any]] = []
        if nxt == "done":
            nodes = list(update["new_nodes"])
            events.append(self._event("step_retry_done", run, f"RETRYSTEP on {','.join(nodes)}"))
            # The bad node's record, as the replace path leaves it: replaced by the spare
            actions.append(
                {
                    "kind": "replace",
                    "node": run.bad_node,
                    "job_id": run.job_id,
                    "reason": run.reason,
                    "cause": f"step retry {run.id} of job {run.job_id}: {run.cause}",
                    "params": {"spare": run.spare, "step_retry": run.id},
                    "state": "done",
                }
            )
            metrics.STEP_RETRY_SECONDS.observe(max(0.0, now - run.created_at))
            seen = [
                f.first_seen
                for f in self.store.node_faults(run.bad_node, limit=20)
                if f.first_seen <= run.created_at
            ]
            if seen:  # the fault that ended the step (a dead node may have none)
                metrics.STEP_RETRY_FAULT_SECONDS.observe(max(0.0, now - max(seen)))
        self.store.set_step_phase(
            run.id,
            nxt,
            now,
            expect=run.phase,
            fence=self.fence,
            helper_id=update.get("helper_id"),
            new_nodes=update.get("new_nodes"),
            outcome="RETRYSTEP" if nxt == "done" else None,
            events=events,
            actions=actions,
        )

    def _fail(self, run: StepRetry, why: str, now: float) -> None:
        message = f"{run.phase} failed: {why}; rolling back, then REQUEUE"
        self.store.set_step_phase(
            run.id,
            "rollback",
            now,
            expect=run.phase,
            fence=self.fence,
            cause=why,
            rollback_from=run.phase,
            events=[self._event("step_retry_failed", run, message)],
        )
        log.warning("step retry %d of job %d: %s", run.id, run.job_id, message)

    def _rollback(self, run: StepRetry, now: float) -> int:
        """Undo what is safe to undo; requeue the job. Each step repeatable."""
        jobs = {j.job_id: j for j in self.slurm.list_jobs()}
        for j in jobs.values():
            if self._helper_of(run, j):
                self.slurm.cancel(j.job_id)
        job = jobs.get(run.job_id)
        running = job is not None and job.state.upper() == "RUNNING"
        spare = {n.name: n for n in self.slurm.list_nodes()}.get(run.spare)
        in_job = running and job is not None and run.spare in job.nodes
        held = any(r.name == run.helper_name for r in self.slurm.reservations())
        self._crash_hook("rollback")
        if spare is not None and not spare.drained and not in_job and held:
            # Back to the pool while its reservation still keeps user jobs off it; a
            # spare never reserved for us was not ours to take (the expand phase
            # reserves before it resumes), so one in service then is left alone.
            try:
                self.slurm.drain(run.spare, SPARE, expect=("",))
            except Refused as exc:
                log.warning("step retry %d: %s left as it is: %s", run.id, run.spare, exc.why)
        self._unreserve(run)
        actions: list[dict[str, Any]] = []
        note = "the job is no longer running: nothing to requeue"
        if running and job is not None:
            actions, note = self._requeue(run, job)
        self.store.set_step_phase(
            run.id,
            "failed",
            now,
            expect="rollback",
            fence=self.fence,
            outcome="REQUEUE",
            events=[self._event("step_retry_requeue", run, f"REQUEUE ({run.cause}): {note}")],
            actions=actions,
        )
        return 1

    def _requeue(self, run: StepRetry, job: Job) -> tuple[list[dict[str, Any]], str]:
        """The job-level requeue intent (the executor applies it), within the job's budget."""
        tracked = self.store.job(run.job_id)
        attempts = tracked.attempts if tracked else 0
        cap = max(run.budget, tracked.cap if tracked else 0)
        if attempts >= cap:
            return [], f"retry budget spent ({attempts}/{cap}): the job is not requeued"
        params = {
            "cap": cap,
            "attempt": attempts + 1,
            "restart_count": job.restart_count,
            "nodes": list(job.nodes),
        }
        cause = f"step retry {run.id} rolled back: {run.cause}"
        row = {"kind": "requeue", "job_id": run.job_id, "cause": cause, "params": params}
        return [{**row, "state": "intent"}], f"job-level requeue {attempts + 1}/{cap} planned"

    def _event(self, kind: str, run: StepRetry, what: str) -> EventIn:
        message = f"step retry {run.id} of job {run.job_id} step {run.step_id}: {what}"
        return EventIn(kind, message, run.bad_node, run.job_id, "step retry")


def _no_event(*_args: object, **_kwargs: object) -> None:
    """Events of a runner without the service's isolation: logged and counted only."""
