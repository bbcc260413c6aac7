"""The controller's side of a simulation run: reconcile passes (``decide``), the
watched step's question (``decide_step``), and whether anything is left for a later
pass. A mixin of ``engine.Sim``, which owns the state and the event loop."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from hyperpod_agent.controller.stepretry.plan import Outcome
from hyperpod_agent.simulate.cluster import Cluster, JobState, Role
from hyperpod_agent.simulate.inputs import Inputs
from hyperpod_agent.simulate.passes import controller_pass, next_timer, step_decision

# event kinds, in the order same-time events are handled
FAULT, OVER, REBOOTED, DETECT, NOTICE, RESUBMIT, GIVE_UP, ALLOC, PRODUCTIVE, PASS = range(10)
RUNNING, DOWN, STARTING = "running", "down", "starting"
# With something pending and no time rule due (a job waiting days for a repair), a pass
# this often; anything that could change the answer wakes one at once (next_timer).
SLOW_PASS_S = 3600.0


class Deciding:
    """Reconcile passes and step decisions; the state is ``engine.Sim``'s."""

    if TYPE_CHECKING:  # what Sim defines
        ours: bool
        pass_due: float
        now: float
        cluster: Cluster
        job: JobState
        dead_since: dict[int, float]
        inp: Inputs
        rng: random.Random
        counts: dict[str, int]
        state: str
        user_wait: bool
        outcome: str
        epoch: int

        def push(self, at: float, kind: int, a: int = 0, b: int = 0) -> None: ...
        def start(self, alloc_in: float, outcome: str) -> None: ...
        def resubmit_later(self) -> None: ...
        def try_start(self) -> None: ...

    def wake(self, at: float) -> None:
        """A reconcile pass at ``at`` (a report woke the loop, or its interval came)."""
        if self.ours and at < self.pass_due:
            self.pass_due = at
            self.push(at, PASS)

    def on_pass(self, _: int, __: int) -> None:
        if self.now != self.pass_due:
            return  # an earlier pass was scheduled after this one
        self.pass_due = math.inf
        out = controller_pass(
            self.cluster, self.job, self.now, self.dead_since,
            lambda: self.inp.reboot_s.sample(self.rng),
        )  # fmt: skip
        self.counts["decide"] += 1
        self.counts["incident"] += int(out.incident)
        for i, until in out.reboots:
            self.push(until, REBOOTED, i)
        if self.state == DOWN and not self.user_wait:
            if out.requeued:
                # Slurm counts the requeue (restart_cnt) the moment it takes it
                self.job.slurm_state = "PENDING"
                self.job.restart_count += 1
                self.start(self.inp.requeue_restart_s.sample(self.rng), "requeue")
            elif out.exhausted:
                self.outcome = "resubmit"
                self.resubmit_later()
            elif out.not_retried:
                # not requeued (no fault of its nodes seen yet): unless one turns up and
                # the policy requeues it meanwhile, the user resubmits it
                wait = self.inp.resubmit_wait_s.sample(self.rng)
                self.push(self.now + wait, GIVE_UP, self.epoch)
        self.try_start()
        if self.pending():
            timer = next_timer(self.cluster, self.job, self.now, self.dead_since)
            self.wake(timer if timer is not None else self.now + SLOW_PASS_S)

    def pending(self) -> bool:
        """Is something left for a later pass: the job down with no decision yet, or a
        node in service with a fault nobody acted on (a shared-cause wait, a lost
        heartbeat not yet timed out)?"""
        if self.state == DOWN and not self.user_wait:
            return True
        c = self.cluster
        return any(
            c.nodes[i].role in (Role.JOB, Role.IDLE)
            and (c.nodes[i].fault_row is not None or c.nodes[i].dead)
            for i in c.timed  # the nodes in play that can be faulty or dead (Cluster.touch)
        )

    def step_failed(self) -> None:
        """The watched step ended with the fault: its helper asks the controller."""
        job = self.job
        if self.state != DOWN or not job.watched or job.told_to_end is not None:
            return
        outcome = step_decision(self.cluster, job, self.now, self.dead_since)
        self.counts["step"] += 1
        if outcome is Outcome.RETRYSTEP:
            self.start(self.inp.step_restart_s.sample(self.rng), "step_retry")
        elif outcome is Outcome.REQUEUE:
            # unwatched: the job is today's recovery's (api/steps.py); its script ends
            job.watched = False
            job.slurm_state, job.end_time = "FAILED", self.now
        else:
            self.outcome = "resubmit"
            self.resubmit_later()
