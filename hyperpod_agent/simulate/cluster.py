"""The simulated cluster's nodes and job, and what of them the controller's view holds.

The controller's policy (``controller/policy.py: decide``, ``controller/stepretry/plan.py:
decide_step``) is called with a :class:`Snapshot` built from it (``view.py``), the same
frozen records it gets from Slurm and the store in production. One difference, for speed:
the snapshot holds the nodes *in play* (every node out of service, faulty, rebooting,
idle, in the spare pool, the job's batch host) and leaves out the job's healthy nodes,
which no rule acts on. What they would have counted for is kept:

- the blast radius (``safety.limit_take_outs``) compares the nodes out with
  ``allowed_out(policy, partition size)``; the view's policy carries that limit, computed on
  the real partition, as ``min_unhealthy_nodes`` (with a vanishing fraction), so the rule
  sees the real limit and every node that counts against it;
- the capacity check of a requeue (``autoresume.capacity_shortfall``: usable nodes against
  the job's size) compares the job's nodes in the view with the usable ones in the view:
  the healthy nodes left out are on both sides of that comparison.

Nodes held for repair (out under our ``hold`` or ``replace`` reason, no reboot under way,
not listed in the job) are left out too, though in play: they are out for days, and no
rule acts on them (``node_rules._node_rules`` leaves them to their repair). What they count
for is kept: their open faults stay in the snapshot (a shared cause counts them), and those
that count against the blast radius (``safety.unavailable``) are taken off the limit the
view's policy carries.

Idle nodes (in service, healthy, no reason, not the batch host: ``Cluster.inert``) are
left out as far as no decision can depend on them (``Cluster.lean``). No rule acts on such
a node: ``node_rules._node_rules`` finds no fault, no reason of ours, a fresh heartbeat;
spares, deep checks and hangs are other nodes'; the blast radius counts it nowhere. What
it counts for is the capacity check of a requeue (``autoresume.capacity_shortfall``):
usable nodes against the job's size, ``max(1, len(job.nodes))``.

- One outside the job adds one usable node: a pass keeps as many of them as the job has
  nodes in the view (at least one), lowest names first. With ``u`` usable nodes among the
  rest and ``m`` the job's nodes in the view, ``u + idle < m`` comes out the same with
  ``min(idle, max(1, m))`` idle nodes.
- One listed among an ended job's nodes adds one to both sides: left out (one is kept if
  none of the job's would stay, so that its size is never the 1 of an empty list). Its
  past is read as well, by ``autoresume._faulty_nodes`` for a FAILED job (a fault first
  seen by the end plus ``fault_window_s``) and by ``decide_step``'s ``attributable``; so
  it is left out only from a pass's view, of a PENDING job (no rule reads its nodes) or of
  a FAILED one when every fault in its history was first seen after that.

``tests/unit/test_simulate_runs.py`` and ``test_simulate_view.py`` check that runs decided
on the view and on the full snapshot come out the same.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.safety import parsed_reason, unavailable
from hyperpod_agent.controller.store.rows import ActionRow, FaultRow, TrackedJob
from hyperpod_agent.reasons import SPARE, Verb
from hyperpod_agent.simulate.causes import FaultClass
from hyperpod_agent.slurm.models import Node

# The simulation's clock starts here (epoch seconds): the policy formats times as dates.
EPOCH = 1_750_000_000.0
PARTITION = "train"
SPARE_MARGIN = 4  # ready spares in the view beyond one per node the pass could act on
JOB_NAME = "train"


class Role(enum.Enum):
    JOB = "job"  # in service, in the job's allocation
    IDLE = "idle"  # in service, not in the job
    SPARE = "spare"  # drained as hyperpod:spare
    OUT = "out"  # out of service (ours, Slurm's, or dead)


@dataclass
class NodeState:
    """One node. ``fault_until`` is when its current fault is over (None: healthy)."""

    name: str
    role: Role
    fault_until: float | None = None
    fault_cls: FaultClass | None = None
    fault_row: FaultRow | None = None  # the open fault the agent reports
    dead: bool = False  # no agent, slurmd not responding
    reason: str = ""  # Slurm reason while OUT
    reason_time: float = 0.0
    rebooting_until: float | None = None
    reboot_row: ActionRow | None = None
    boot_time: float | None = None
    held: bool = False  # held for repair (replace, hold): back once repaired
    replaced: bool = False  # held, and a spare took its place
    history: deque[FaultRow] = field(default_factory=deque)
    done: deque[ActionRow] = field(default_factory=deque)

    @property
    def faulty(self) -> bool:
        return self.fault_until is not None


@dataclass
class JobState:
    """The one large job (opted in with ``--auto-resume=cap``)."""

    job_id: int
    cap: int
    nodes: set[int]
    batch_host: int
    slurm_state: str = "RUNNING"  # what Slurm shows: RUNNING, FAILED, PENDING
    start_time: float = 0.0
    end_time: float | None = None
    restart_count: int = 0
    tracked: TrackedJob | None = None
    watched: bool = False  # step retry: a helper watches its step
    told_to_end: float | None = None
    retries_done: int = 0


class Cluster:
    """Nodes by index; names are ``n00000``... so that sorting by name is by index.

    ``play`` is the set of nodes in play (see the module doc), kept up to date by
    ``touch`` after every change to a node, so a pass never walks the whole cluster."""

    def __init__(
        self, nodes: int, spares: int, config: ControllerConfig, full_view: bool = False
    ) -> None:
        self.config = config
        self.full_view = full_view  # the policy sees every node (the view's own check)
        self.nodes = [
            NodeState(f"n{i:05d}", Role.JOB if i < nodes - spares else Role.SPARE)
            for i in range(nodes)
        ]
        self.play: set[int] = set()
        # Filed by ``touch`` with ``play``, so that a pass walks none of the cluster: the
        # nodes out of the job by role (all in play), those held for repair (with whether
        # they count against the blast radius), those a time rule may wait on
        # (``passes.next_timer``), and the idle ones no rule acts on (``lean``).
        self.roles: dict[Role, set[int]] = {r: set() for r in Role if r is not Role.JOB}
        self.held: dict[int, bool] = {}
        self.timed: set[int] = set()
        self.inert: set[int] = set()
        for i, n in enumerate(self.nodes):
            if n.role is Role.SPARE:
                n.reason = SPARE
            self.touch(i)
        # node -> when its latest fault was reported or closed: an ended job's judgement
        # reads the faults of its nodes near its end (autoresume._faulty_nodes), healthy
        # now or not
        self.recent: dict[int, float] = {}
        self.requeue_times: deque[float] = deque()
        self.retry_times: deque[float] = deque()
        self._ids = 0
        # What the view is built from that rarely changes between passes: each node as
        # Slurm shows it (with what it was built from), the view's config by its limit.
        self.shown: dict[int, tuple[tuple[object, ...], Node]] = {}
        self.view_configs: dict[int, ControllerConfig] = {}

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def touch(self, i: int) -> None:
        """Re-file node ``i`` after a change: in play or not."""
        n = self.nodes[i]
        if n.role is not Role.JOB or n.faulty or n.dead or n.fault_row is not None:
            self.play.add(i)
        else:
            self.play.discard(i)
        for role, members in self.roles.items():
            if role is n.role:
                members.add(i)
            else:
                members.discard(i)
        ours = parsed_reason(n.reason) if n.role is Role.OUT else None
        if ours is not None and ours.verb in (Verb.HOLD, Verb.REPLACE):
            # Slurm shows an out node the same whether the job runs or not
            replaced = (n.name,) if n.replaced else ()
            self.held[i] = unavailable(slurm_node(n, False), replaced)
        else:
            self.held.pop(i, None)
        reported = n.role in (Role.JOB, Role.IDLE) and (n.fault_row is not None or n.dead)
        if reported or (ours is not None and ours.verb is Verb.RESET):
            self.timed.add(i)
        else:
            self.timed.discard(i)
        # in service, healthy and left alone as the policy sees it: shown IDLE with no
        # reason and responding, its agent's verdict healthy and fresh (``_health``)
        quiet = n.fault_row is None and n.rebooting_until is None and n.reboot_row is None
        if n.role is Role.IDLE and quiet and not n.reason and not n.dead:
            self.inert.add(i)
        else:
            self.inert.discard(i)

    def in_play(self, job: JobState) -> tuple[list[int], list[int]]:
        """The nodes in play the policy's view holds (before ``lean``), and the nodes held
        for repair it leaves out (see the module doc)."""
        if self.full_view:
            return list(range(len(self.nodes))), []
        extra = {job.batch_host}
        if job.slurm_state != "RUNNING":
            extra |= {i for i in self.recent if i in job.nodes}
        held = sorted(
            i
            for i in self.held
            if i not in extra and i not in job.nodes and self.nodes[i].reboot_row is None
        )
        idx = sorted((self.play | extra).difference(held))
        # The pool hands out its ready spares lowest name first (replacement.SparePool), one
        # per replacement: a pass never needs more than one per node it could act on (a
        # node held for repair is not one: the policy leaves it alone).
        # Spares that are not ready change only the wording of a "no spare" event.
        acting = sum(
            1
            for i in idx
            if self.nodes[i].role is not Role.SPARE and self._known(i) and i not in self.held
        )
        ready = [i for i in idx if self.nodes[i].role is Role.SPARE and not self._known(i)]
        # (a spare still listed among an ended job's nodes counts in its size: kept)
        keep = set(ready[: acting + SPARE_MARGIN])
        view = [
            i for i in idx if self.nodes[i].role is not Role.SPARE or i in keep or i in job.nodes
        ]
        return view, held

    def left(self, job: JobState) -> set[int]:
        """The job's listed nodes no longer in service in it (every node out of the JOB
        role is filed by role: this walks those, not the whole job)."""
        return {i for members in self.roles.values() for i in members if i in job.nodes}

    def lean(self, job: JobState, view: list[int], step: bool = False) -> list[int]:
        """``view`` less the idle nodes no decision depends on (see the module doc): of
        the inert nodes outside the job, as many as the job has nodes in the view (at
        least one); of those listed in an ended job, the ones whose past cannot explain
        its end, for a pass (``decide``) only."""
        if self.full_view:
            return view
        window = self.config.auto_resume.fault_window_s
        end = job.end_time
        ended = not step and (
            job.slurm_state == "PENDING" or (job.slurm_state == "FAILED" and end is not None)
        )
        free: list[int] = []
        listed: list[int] = []
        mine = 0
        for i in view:
            if i not in self.inert or i == job.batch_host:
                mine += i in job.nodes
            elif i not in job.nodes:
                free.append(i)
            elif ended and (
                job.slurm_state == "PENDING" or _after(self.nodes[i], (end or 0.0) + window)
            ):
                listed.append(i)
            else:
                mine += 1
        if not free and not listed:
            return view
        if not mine and listed:  # one stays: the job's size in the view is never 0
            mine, listed = 1, listed[1:]
        out = set(free[max(1, mine) :]) | set(listed)
        return [i for i in view if i not in out]

    def _known(self, i: int) -> bool:
        """Faulty as the controller knows it (a fault not reported yet is not known):
        a node a replacement could be for, or a spare the pool would not hand out."""
        n = self.nodes[i]
        return n.dead or n.fault_row is not None or n.rebooting_until is not None

    def count(self, role: Role) -> int:
        """Nodes in ``role``; every role but JOB is filed (``touch``)."""
        if role is Role.JOB:
            return sum(1 for n in self.nodes if n.role is role)
        return len(self.roles[role])

    def trim(self, now: float) -> None:
        """Forget what the policy's windows no longer look at: the nodes' recent faults,
        the requeues and retries of the last minute."""
        window = self.config.auto_resume.fault_window_s
        for i in [i for i, at in self.recent.items() if at < now - 2 * window]:
            del self.recent[i]
        for times in (self.requeue_times, self.retry_times):
            while times and times[0] < now - 60.0:
                times.popleft()

    def trim_nodes(self, idx: list[int], now: float) -> None:
        """Forget the history of nodes ``idx`` that the policy's windows no longer look
        at. A node's history is read only while it is in the view (``snapshot``): it is
        trimmed when it is, to what it would have been trimmed to every pass."""
        keep_faults = max(self.config.policy.lemon_window_s, self.config.auto_resume.fault_window_s)
        keep_done = self.config.policy.escalation_window_s
        for i in idx:
            n = self.nodes[i]
            while n.history and n.history[0].first_seen < now - keep_faults:
                n.history.popleft()
            while n.done and n.done[0].updated_at < now - keep_done:
                n.done.popleft()


def _after(n: NodeState, t: float) -> bool:
    """Was every fault in the node's history first seen after ``t``? (The history is in
    the order the faults were seen.)"""
    return not n.history or n.history[0].first_seen > t + 1.0  # (dates keep microseconds)


def dt(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


def slurm_node(n: NodeState, job_running: bool) -> Node:
    """The node as ``scontrol show node`` would show it."""
    flags: set[str] = set()
    state = "ALLOCATED" if n.role is Role.JOB and job_running else "IDLE"
    if n.role in (Role.SPARE, Role.OUT) and n.reason:
        flags.add("DRAIN")
    if n.rebooting_until is not None:
        flags.add("REBOOT_ISSUED")
    if n.dead:
        state = "DOWN"
        flags.add("NOT_RESPONDING")
    return Node(
        n.name,
        state,
        frozenset(flags),
        reason=n.reason if "DRAIN" in flags else "",
        reason_user="root",
        reason_time=dt(n.reason_time) if "DRAIN" in flags else None,
        partitions=(PARTITION,),
        boot_time=dt(n.boot_time),
    )
