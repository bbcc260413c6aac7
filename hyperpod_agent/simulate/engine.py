"""The event loop: faults arrive, the job runs, stops, and is brought back.

The job's life: RUNNING (progress, checkpoints) -> a fault on one of its nodes -> DOWN
(detection, then waiting for a decision or capacity) -> STARTING (allocated again or its
step relaunched: start-up, restore, first step) -> RUNNING. With our strategies every
decision is the controller's: ``decide`` in a reconcile pass (node actions, requeues) and
``decide_step`` when a watched step fails (step retry); see ``passes.py``. With "slurm"
nothing decides: Slurm notices (or the collective times out), the user resubmits.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.simulate.causes import FaultClass
from hyperpod_agent.simulate.cluster import EPOCH, Cluster, JobState, Role
from hyperpod_agent.simulate.deciding import (
    ALLOC,
    DETECT,
    DOWN,
    FAULT,
    GIVE_UP,
    NOTICE,
    OVER,
    PASS,
    PRODUCTIVE,
    REBOOTED,
    RESUBMIT,
    RUNNING,
    STARTING,
    Deciding,
)
from hyperpod_agent.simulate.faults import Fault
from hyperpod_agent.simulate.inputs import Inputs
from hyperpod_agent.simulate.ledger import Incident, Ledger
from hyperpod_agent.simulate.passes import close_fault, open_fault
from hyperpod_agent.simulate.remedy import bring_in, reboot_done, to_pool
from hyperpod_agent.simulate.result import Result, Scenario, Strategy

NODE_FAIL, JOB_FAILED = 1, 2  # how a job still shown running ends (NOTICE)
SAMPLE_S = 3600.0  # the spares timeline: one row per simulated hour at most


class Sim(Deciding):
    """One run of one scenario over a list of faults."""

    def __init__(
        self,
        scenario: Scenario,
        faults: Sequence[Fault],
        inputs: Inputs,
        config: ControllerConfig | None = None,
        full_view: bool = False,
    ) -> None:
        self.s, self.faults, self.inp = scenario, faults, inputs
        self.config = config or ControllerConfig()
        self.rng = random.Random(f"{scenario.seed}:{scenario.strategy.value}")
        self.cluster = Cluster(scenario.nodes, scenario.spares, self.config, full_view)
        self.ours = scenario.strategy is not Strategy.SLURM
        if not self.ours:  # Slurm alone has no pool: the extra nodes are idle in service
            for i in range(scenario.job_nodes, scenario.nodes):
                bring_in(self.cluster, i, EPOCH)
                self.cluster.touch(i)
        self.ledger = Ledger()
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.now = EPOCH
        self.end = EPOCH + scenario.days * 86400.0
        memckpt = scenario.strategy is Strategy.MEMCKPT
        # memory checkpoints: one per step, blocked for the memory tier's copy
        self.interval = inputs.step_s.mean if memckpt else scenario.checkpoint_interval_s
        block = inputs.checkpoint_block_s if self.ours else inputs.baseline_checkpoint_block_s
        self.block = block.mean
        job_nodes = set(range(scenario.job_nodes))
        self.job = JobState(1, scenario.auto_resume_cap, job_nodes, 0, start_time=EPOCH)
        self.job.watched = scenario.strategy in (Strategy.STEP_RETRY, Strategy.MEMCKPT)
        self.state, self.epoch = RUNNING, 0
        self.seg_start = EPOCH
        self.phase, self.phase_since, self.cause = "", EPOCH, ""
        self.inc: tuple[float, str, FaultClass, float] | None = None
        self.outcome = ""
        self.waiting_capacity = False
        self.user_wait = False  # the user is to resubmit: nothing for the controller
        self.allocated = True  # a start under way has its nodes (STARTING only)
        self.dead_since: dict[int, float] = {}
        # a node's fault (for its report) and its end (moved by a second fault meanwhile)
        self.fault_tokens: dict[int, int] = {}
        self.over_tokens: dict[int, int] = {}
        self.pass_due = math.inf
        self.counts = {"decide": 0, "step": 0, "incident": 0, "events": 0}
        self.timeline: list[tuple[float, int, int, int]] = []
        self.next_sample = EPOCH

    # -- the loop ---------------------------------------------------------------------

    def push(self, at: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, kind, self.seq, a, b))

    def run(self) -> Result:
        for k, f in enumerate(self.faults):
            self.push(EPOCH + f.at, FAULT, k)
        handlers = {
            FAULT: self.on_fault, OVER: self.on_over, REBOOTED: self.on_rebooted,
            DETECT: self.on_detect, NOTICE: self.on_notice, RESUBMIT: self.on_resubmit,
            GIVE_UP: self.on_give_up,
            ALLOC: self.on_alloc, PRODUCTIVE: self.on_productive, PASS: self.on_pass,
        }  # fmt: skip
        while self.heap and self.heap[0][0] < self.end:
            at, kind, _, a, b = heapq.heappop(self.heap)
            self.now = at
            self.counts["events"] += 1
            handlers[kind](a, b)
            if kind in (PASS, OVER, REBOOTED) or at >= self.next_sample:
                self.sample()
        self.now = self.end
        self.finish()
        return Result(
            self.s, self.end - EPOCH, self.ledger.kept, dict(self.ledger.by_phase),
            dict(self.ledger.by_cause), self.ledger.incidents, self.timeline, len(self.faults),
            self.counts["decide"], self.counts["step"], self.counts["incident"],
            self.counts["events"],
        )  # fmt: skip

    def sample(self) -> None:
        c = self.cluster
        pool = c.roles[Role.SPARE]
        ready = sum(1 for i in pool if not c.nodes[i].faulty)
        out = len(c.roles[Role.OUT])
        row = (round((self.now - EPOCH) / 86400.0, 4), len(pool), ready, out)
        # a row when something changed, and one an hour at least
        if not self.timeline or self.timeline[-1][1:] != row[1:] or self.now >= self.next_sample:
            self.timeline.append(row)
            self.next_sample = self.now + SAMPLE_S

    def finish(self) -> None:
        """Close the books at the horizon."""
        if self.state == RUNNING:
            self.ledger.run(self.end - self.seg_start, self.interval, self.block, None)
        else:
            self.set_phase("", self.end)

    # -- the job's time -----------------------------------------------------------------

    def set_phase(self, phase: str, at: float | None = None) -> None:
        at = self.now if at is None else at
        if self.phase:
            self.ledger.lose(self.phase, self.cause, at - self.phase_since)
        self.phase, self.phase_since = phase, at

    def interrupt(self, i: int, cls: FaultClass, detected: bool = False) -> None:
        """A fault on node ``i`` of the job stops it (if it is not stopped already)."""
        if self.state == DOWN:
            return
        starting = self.state == STARTING
        if self.state == RUNNING:
            ran = self.now - self.seg_start
            lost = self.ledger.run(ran, self.interval, self.block, cls.category)
            self.inc = (self.now, self.cluster.nodes[i].name, cls, lost)
        else:  # a start under way fails: the time from here is this fault's
            self.epoch += 1
            if self.inc is None:
                self.inc = (self.now, self.cluster.nodes[i].name, cls, 0.0)
        self.set_phase("")
        self.cause, self.state = cls.category, DOWN
        self.set_phase("waiting" if detected else "detection")
        self.outcome = ""
        job = self.job
        if self.ours and not job.watched and (starting or not (cls.urgent or cls.dead)):
            # the job's processes die with the node (or its start does): Slurm shows the
            # job FAILED; an urgent fault under a running job is reported before that
            job.slurm_state, job.end_time = "FAILED", self.now

    def detected(self) -> None:
        if self.state == DOWN and self.phase == "detection":
            self.set_phase("waiting")

    def start(self, alloc_in: float, outcome: str) -> None:
        """A requeue, relaunch or resubmission: allocated after ``alloc_in``."""
        self.epoch += 1
        self.allocated = False
        self.state, self.outcome = STARTING, outcome
        self.set_phase("restart")
        self.push(self.now + alloc_in, ALLOC, self.epoch)

    def warmup(self, memory: bool) -> float:
        restore = self.inp.restore_memory_s if memory else self.inp.restore_s
        return (
            self.inp.job_init_s.sample(self.rng)
            + restore.sample(self.rng)
            + self.inp.first_step_s.sample(self.rng)
        )

    def on_alloc(self, epoch: int, _: int) -> None:
        """The job has its nodes again (or waits for them); a broken one ends it at once."""
        if epoch != self.epoch or self.state != STARTING:
            return
        if not self.allocate():
            self.waiting_capacity = True
            self.set_phase("waiting")
            return
        job = self.job
        # a faulty node is in play (cluster.touch): only those can end the start
        for i in sorted(self.cluster.play & job.nodes):
            n = self.cluster.nodes[i]
            if n.faulty and n.fault_cls is not None:
                self.interrupt(i, n.fault_cls, detected=n.fault_row is not None or not self.ours)
                if self.ours:
                    self.wake(self.now)
                return
        self.allocated = True
        job.slurm_state, job.start_time, job.end_time = "RUNNING", self.now, None
        job.told_to_end = None
        job.watched = self.s.strategy in (Strategy.STEP_RETRY, Strategy.MEMCKPT)
        memory = self.outcome == "step_retry"
        self.push(self.now + self.warmup(memory), PRODUCTIVE, self.epoch)

    def allocate(self) -> bool:
        """Give the job ``job_nodes`` nodes in service; False when there are too few.
        The job's node list becomes this run's: nodes taken out since leave it."""
        c, job = self.cluster, self.job
        kept = job.nodes - c.left(job)
        need = self.s.job_nodes - len(kept)
        idle = sorted(c.roles[Role.IDLE]) if need > 0 else []
        if len(idle) < need:
            return False
        for i in idle[:need]:
            c.nodes[i].role = Role.JOB
            kept.add(i)
            c.touch(i)
        job.nodes = kept
        if job.batch_host not in kept:
            job.batch_host = min(kept)
        return True

    def on_productive(self, epoch: int, _: int) -> None:
        if epoch != self.epoch or self.state != STARTING:
            return
        self.set_phase("")
        self.state, self.seg_start = RUNNING, self.now
        if self.inc is not None:
            at, node, cls, lost = self.inc
            down = self.now - at
            self.ledger.incidents.append(
                Incident(at - EPOCH, node, cls.name, cls.category, self.outcome or "?", down, lost)
            )
        self.inc = None

    def try_start(self) -> None:
        """A job waiting for capacity starts once there is enough."""
        if self.waiting_capacity and self.allocate():
            self.waiting_capacity = False
            self.state = STARTING
            self.set_phase("restart")
            self.push(self.now, ALLOC, self.epoch)

    def resubmit_later(self) -> None:
        """The user resubmits (Slurm alone, or a spent budget): a new job, a new budget."""
        self.job.job_id += 1
        self.job.tracked, self.job.retries_done = None, 0
        self.job.slurm_state, self.job.end_time = "PENDING", None
        self.detected()
        self.user_wait = True
        self.push(self.now + self.inp.resubmit_wait_s.sample(self.rng), RESUBMIT, self.epoch)

    # -- node events --------------------------------------------------------------------

    def on_fault(self, k: int, _: int) -> None:
        f, c = self.faults[k], self.cluster
        n = c.nodes[f.node]
        if n.faulty:  # a second fault while the first lasts: the node is out longer
            n.fault_until = max(n.fault_until or 0.0, self.now + f.duration)
            self.over_tokens[f.node] = self.over_tokens.get(f.node, 0) + 1
            self.push(n.fault_until, OVER, f.node, self.over_tokens[f.node])
            return
        n.fault_until, n.fault_cls, n.dead = self.now + f.duration, f.cls, f.cls.dead
        self.fault_tokens[f.node] = self.fault_tokens.get(f.node, 0) + 1
        self.over_tokens[f.node] = self.over_tokens.get(f.node, 0) + 1
        self.push(n.fault_until, OVER, f.node, self.over_tokens[f.node])
        if f.cls.dead:
            self.dead_since[f.node] = self.now
        in_job = n.role is Role.JOB
        # a job not allocated yet meets its nodes' faults when it is (on_alloc)
        hit = in_job and self.state != DOWN and (self.state == RUNNING or self.allocated)
        if hit:
            self.interrupt(f.node, f.cls)
        if self.ours:
            if f.cls.dead:  # heartbeat lost, then the drain (detect_s includes its drain)
                wait = self.inp.detect_dead_s.sample(self.rng) + self.inp.drain_s.sample(self.rng)
            else:
                wait = self.inp.detect_s.sample(self.rng)
            self.push(self.now + wait, DETECT, f.node, self.fault_tokens[f.node])
            if hit and f.cls.dead:  # Slurm's own verdict on a job whose node died
                node_fail = self.inp.slurm_detect_dead_s.sample(self.rng)
                self.push(self.now + node_fail, NOTICE, self.epoch, NODE_FAIL)
            elif hit and f.cls.urgent:  # a requeue held back: the job fails by itself
                timeout = self.inp.slurm_detect_hang_s.sample(self.rng)
                self.push(self.now + timeout, NOTICE, self.epoch, JOB_FAILED)
        else:
            # Slurm alone: the node is unusable (down, or excluded by the user) until mended
            if n.role in (Role.JOB, Role.IDLE):
                self.job.nodes.discard(f.node)
                n.role = Role.OUT
            if hit:
                hang = self.inp.slurm_detect_dead_s if f.cls.dead else self.inp.slurm_detect_hang_s
                self.push(self.now + hang.sample(self.rng), NOTICE, self.epoch)
        c.touch(f.node)

    def on_detect(self, i: int, token: int) -> None:
        """The agent reports the fault (or the heartbeat is gone): the controller hears."""
        n = self.cluster.nodes[i]
        if token != self.fault_tokens.get(i) or not n.faulty or n.fault_cls is None:
            return
        if not n.dead and n.fault_row is None:
            open_fault(self.cluster, i, n.fault_cls, self.now)
        self.cluster.touch(i)
        if i in self.job.nodes:
            self.detected()
            if self.job.watched and self.state == DOWN:
                self.step_failed()
        if n.role is not Role.SPARE or self.pending():
            self.wake(self.now)

    def on_notice(self, epoch: int, node_fail: int) -> None:
        """With our controller, a job still shown running whose requeue was held back
        ends by itself: NODE_FAIL once Slurm sets a dead node DOWN, FAILED once its
        collective times out; the auto-resume rules take it from there. Slurm alone: the
        job ended (node DOWN, or the collective timed out) and the user resubmits."""
        if node_fail:
            job = self.job
            if epoch == self.epoch and self.state == DOWN and job.slurm_state == "RUNNING":
                state = "NODE_FAIL" if node_fail == NODE_FAIL else "FAILED"
                job.slurm_state, job.end_time = state, self.now
                self.wake(self.now)
            return
        if epoch == self.epoch and self.state == DOWN:
            self.outcome = "resubmit"
            self.resubmit_later()

    def on_resubmit(self, epoch: int, _: int) -> None:
        if epoch == self.epoch and self.state == DOWN:
            self.user_wait = False
            self.outcome = self.outcome or "resubmit"
            self.job.slurm_state = "PENDING"
            self.start(0.0, self.outcome)

    def on_give_up(self, epoch: int, _: int) -> None:
        if epoch == self.epoch and self.state == DOWN and not self.user_wait:
            self.outcome = "resubmit"
            self.job.job_id += 1
            self.job.tracked, self.job.retries_done = None, 0
            self.job.slurm_state, self.job.end_time = "PENDING", None
            self.start(0.0, self.outcome)

    def on_over(self, i: int, token: int) -> None:
        """The fault is over (repaired, or it cleared): the node can work again."""
        c = self.cluster
        n = c.nodes[i]
        if token != self.over_tokens.get(i):
            return
        n.fault_until, n.fault_cls, n.dead = None, None, False
        self.dead_since.pop(i, None)
        if n.fault_row is not None:
            close_fault(c, i, self.now)
        if not self.ours:
            if n.role is Role.OUT:
                n.role = Role.IDLE
            c.touch(i)
            self.try_start()
            return
        if n.held and n.rebooting_until is None:
            # repaired: an admin puts it back, into service if the job is short of nodes
            mine = len(self.job.nodes) - len(c.left(self.job))
            if mine < self.s.job_nodes:
                bring_in(c, i, self.now)
            else:
                to_pool(n, self.now)
        c.touch(i)
        self.try_start()
        if n.role is not Role.SPARE or self.pending():
            self.wake(self.now)  # (the policy never acts on a spare: no pass for one)

    def on_rebooted(self, i: int, _: int) -> None:
        c = self.cluster
        n = c.nodes[i]
        if n.rebooting_until is None:
            return
        reboot_done(c, i, self.now)
        if n.faulty and n.fault_cls is not None and not n.dead:
            # the reboot did not mend it: the agent's first report after boot says so
            close_fault(c, i, self.now)
            open_fault(self.cluster, i, n.fault_cls, self.now)
        c.touch(i)
        self.wake(self.now)

    # -- the controller -----------------------------------------------------------------
