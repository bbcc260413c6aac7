"""The controller's view of the simulated cluster: the :class:`Snapshot` and the config a
pass (or a step's question) is decided with, built from the nodes ``Cluster.in_play`` and
``Cluster.lean`` keep (what it leaves out, and why no decision changes: ``cluster.py``).
"""

from __future__ import annotations

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.safety import allowed_out
from hyperpod_agent.controller.snapshot import NodeHealth, Snapshot
from hyperpod_agent.controller.store.rows import TrackedJob
from hyperpod_agent.health import Verdict
from hyperpod_agent.simulate.cluster import (
    EPOCH,
    JOB_NAME,
    PARTITION,
    Cluster,
    JobState,
    NodeState,
    Role,
    dt,
    slurm_node,
)
from hyperpod_agent.slurm.models import Job, Node


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


def _health(n: NodeState, now: float, last_heard: float) -> NodeHealth:
    if n.dead:
        return NodeHealth(Verdict.FAULTY, last_heard, last_heard)
    verdict = Verdict.FAULTY if n.fault_row is not None else Verdict.HEALTHY
    return NodeHealth(verdict, now, now)


def view(
    cluster: Cluster, job: JobState, now: float, dead_since: dict[int, float], step: bool = False
) -> tuple[Snapshot, ControllerConfig]:
    """The policy's view of the cluster at ``now`` and the config to decide it with
    (``step``: for ``decide_step``)."""
    idx, held = cluster.in_play(job)
    cluster.trim_nodes(idx, now)
    idx = cluster.lean(job, idx, step)
    # what the held nodes left out count against the blast radius, as the rule counts
    out = sum(1 for i in held if cluster.held[i])
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
                start_time=dt(job.start_time),
                end_time=dt(job.end_time),
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
