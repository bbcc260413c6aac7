"""The simulated cluster's nodes and job, and the controller's view of them.

The controller's policy (``controller/policy.py: decide``, ``controller/stepretry/plan.py:
decide_step``) is called with a :class:`Snapshot` built here, the same frozen records it
gets from Slurm and the store in production. One difference, for speed: the snapshot holds
the nodes *in play* (every node out of service, faulty, rebooting, idle, in the spare pool,
the job's batch host) and leaves out the job's healthy nodes, which no rule acts on. What
they would have counted for is kept:

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

``tests/unit/test_simulate_runs.py`` and ``test_simulate_view.py`` check that runs decided
on the view and on the full snapshot come out the same.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.safety import allowed_out, parsed_reason, unavailable
from hyperpod_agent.controller.snapshot import NodeHealth, Snapshot
from hyperpod_agent.controller.store.rows import ActionRow, FaultRow, TrackedJob
from hyperpod_agent.health import Verdict
from hyperpod_agent.reasons import SPARE, Verb
from hyperpod_agent.simulate.causes import FaultClass
from hyperpod_agent.slurm.models import Job, Node

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

    def in_play(self, job: JobState) -> tuple[list[int], list[int]]:
        """The nodes the policy's view holds, and the nodes held for repair it leaves out
        (see the module doc)."""
        if self.full_view:
            return list(range(len(self.nodes))), []
        extra = {job.batch_host}
        if job.slurm_state != "RUNNING":
            extra |= {i for i in self.recent if i in job.nodes}
        idx: list[int] = []
        held: list[int] = []
        for i in sorted(self.play | extra):
            left_out = i not in extra and i not in job.nodes and self._held(i)
            (held if left_out and self.nodes[i].reboot_row is None else idx).append(i)
        # The pool hands out its ready spares lowest name first (replacement.SparePool), one
        # per replacement: a pass never needs more than one per node it could act on (a
        # node held for repair is not one: the policy leaves it alone).
        # Spares that are not ready change only the wording of a "no spare" event.
        acting = sum(
            1
            for i in idx
            if self.nodes[i].role is not Role.SPARE and self._known(i) and not self._held(i)
        )
        ready = [i for i in idx if self.nodes[i].role is Role.SPARE and not self._known(i)]
        # (a spare still listed among an ended job's nodes counts in its size: kept)
        keep = set(ready[: acting + SPARE_MARGIN])
        view = [
            i for i in idx if self.nodes[i].role is not Role.SPARE or i in keep or i in job.nodes
        ]
        return view, held

    def left(self, job: JobState) -> set[int]:
        """The job's listed nodes no longer in service in it. A node out of the JOB role
        is in play (``touch``), so this walks the few in play, not the whole job."""
        return {i for i in self.play & job.nodes if self.nodes[i].role is not Role.JOB}

    def _held(self, i: int) -> bool:
        """Out under our hold or replace reason: the policy leaves the node to its repair
        (``node_rules._node_rules``), so no replacement is ever for it."""
        n = self.nodes[i]
        ours = parsed_reason(n.reason) if n.role is Role.OUT else None
        return ours is not None and ours.verb in (Verb.HOLD, Verb.REPLACE)

    def _known(self, i: int) -> bool:
        """Faulty as the controller knows it (a fault not reported yet is not known):
        a node a replacement could be for, or a spare the pool would not hand out."""
        n = self.nodes[i]
        return n.dead or n.fault_row is not None or n.rebooting_until is not None

    def count(self, role: Role) -> int:
        """Nodes in ``role``; every role but JOB is in play, so this walks only those."""
        if role is Role.JOB:
            return sum(1 for n in self.nodes if n.role is role)
        return sum(1 for i in self.play if self.nodes[i].role is role)

    def trim(self, now: float) -> None:
        """Forget history the policy's windows no longer look at (nodes in play only:
        a node's history is read only while it is in play)."""
        keep_faults = max(self.config.policy.lemon_window_s, self.config.auto_resume.fault_window_s)
        keep_done = self.config.policy.escalation_window_s
        for i in self.play:
            n = self.nodes[i]
            while n.history and n.history[0].first_seen < now - keep_faults:
                n.history.popleft()
            while n.done and n.done[0].updated_at < now - keep_done:
                n.done.popleft()
        window = self.config.auto_resume.fault_window_s
        for i in [i for i, at in self.recent.items() if at < now - 2 * window]:
            del self.recent[i]
        for times in (self.requeue_times, self.retry_times):
            while times and times[0] < now - 60.0:
                times.popleft()


def _dt(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


def shown(cluster: Cluster, i: int, job_running: bool) -> Node:
    """Node ``i`` as ``slurm_node`` shows it, built again only when something it shows
    changed (most of the view is the same from one pass to the next)."""
    n = cluster.nodes[i]
    key = (
        n.role,
        job_running,
        n.reason,
        n.reason_time,
        n.rebooting_until is None,
        n.dead,
        n.boot_time,
    )
    known = cluster.shown.get(i)
    if known is not None and known[0] == key:
        return known[1]
    node = slurm_node(n, job_running)
    cluster.shown[i] = (key, node)
    return node


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
        reason_time=_dt(n.reason_time) if "DRAIN" in flags else None,
        partitions=(PARTITION,),
        boot_time=_dt(n.boot_time),
    )


def _health(n: NodeState, now: float, last_heard: float) -> NodeHealth:
    if n.dead:
        return NodeHealth(Verdict.FAULTY, last_heard, last_heard)
    verdict = Verdict.FAULTY if n.fault_row is not None else Verdict.HEALTHY
    return NodeHealth(verdict, now, now)


def view(
    cluster: Cluster, job: JobState, now: float, dead_since: dict[int, float]
) -> tuple[Snapshot, ControllerConfig]:
    """The policy's view of the cluster at ``now`` and the config to decide it with."""
    idx, held = cluster.in_play(job)
    running = job.slurm_state == "RUNNING"
    # what the held nodes left out count against the blast radius, as the rule counts
    out = sum(
        1
        for i in held
        if unavailable(
            shown(cluster, i, running),
            (cluster.nodes[i].name,) if cluster.nodes[i].replaced else (),
        )
    )
    return snapshot(cluster, job, now, dead_since, idx, held), view_config(cluster, out)


def view_config(cluster: Cluster, held_out: int = 0) -> ControllerConfig:
    """The config the view is decided with: the real blast-radius limit carried as
    ``min_unhealthy_nodes``, less the ``held_out`` nodes left out of the view that count
    against it (see the module doc). Below zero it would mean the same as zero: any
    take-out is over the limit."""
    if cluster.full_view:
        return cluster.config
    policy = cluster.config.policy
    members = len(cluster.nodes) - cluster.count(Role.SPARE)  # as safety._members counts
    limit = max(0, allowed_out(policy, members) - held_out)
    if limit not in cluster.view_configs:
        scaled = policy.model_copy(
            update={"max_unhealthy_fraction": 1e-12, "min_unhealthy_nodes": limit}
        )
        cluster.view_configs[limit] = cluster.config.model_copy(update={"policy": scaled})
    return cluster.view_configs[limit]


def snapshot(
    cluster: Cluster,
    job: JobState | None,
    now: float,
    dead_since: dict[int, float],
    idx: list[int],
    held: list[int],
) -> Snapshot:
    """The snapshot of nodes ``idx``, with the open faults of the ``held`` ones too."""
    running = job is not None and job.slurm_state == "RUNNING"
    nodes = {cluster.nodes[i].name: shown(cluster, i, running) for i in idx}
    health = {
        cluster.nodes[i].name: _health(cluster.nodes[i], now, dead_since.get(i, now)) for i in idx
    }
    faulty = sorted(idx + held) if held else idx  # in node order, as for the whole cluster
    open_faults = [cluster.nodes[i].fault_row for i in faulty if cluster.nodes[i].fault_row]
    history = [f for i in idx for f in cluster.nodes[i].history]
    done = [a for i in idx for a in cluster.nodes[i].done]
    in_flight = [cluster.nodes[i].reboot_row for i in idx if cluster.nodes[i].reboot_row]
    jobs: list[Job] = []
    tracked: dict[int, TrackedJob] = {}
    watched: dict[int, float | None] = {}
    if job is not None:
        names = [cluster.nodes[i].name for i in idx if i in job.nodes]
        jobs.append(
            Job(
                job.job_id,
                JOB_NAME,
                job.slurm_state,
                nodes=tuple(names),
                restart_count=job.restart_count,
                auto_resume=job.cap,
                exit_code=1 if job.slurm_state == "FAILED" else None,
                batch_host=cluster.nodes[job.batch_host].name,
                partition=PARTITION,
                start_time=_dt(job.start_time),
                end_time=_dt(job.end_time),
            )
        )
        if job.tracked is not None:
            tracked[job.job_id] = job.tracked
        if job.watched:
            watched[job.job_id] = job.told_to_end
    return Snapshot(
        nodes=nodes,
        jobs=jobs,
        health=health,
        open_faults=[f for f in open_faults if f is not None],
        history=history,
        done=done,
        in_flight=[a for a in in_flight if a is not None],
        tracked=tracked,
        requeues_last_minute=len(cluster.requeue_times),
        started_at=EPOCH - 86400.0,
        replaced=frozenset(cluster.nodes[i].name for i in idx if cluster.nodes[i].replaced),
        watched_jobs=watched,
    )
