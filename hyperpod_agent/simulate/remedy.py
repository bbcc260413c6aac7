"""What the executor does with the policy's node actions, on the simulated nodes.

The policy (``decide``) says what to do; here it is done, as ``controller/actions.py``
would through Slurm: a drain takes the node out under the policy's reason, a reboot
keeps it out for the reboot's time, a replacement holds the node for repair and brings
the promised spare into service, a resume puts a node back. The simulation does not
model the executor's retries or failures: every action succeeds at once.
"""

from __future__ import annotations

from collections.abc import Callable

from hyperpod_agent.controller.snapshot import Kind, PlannedAction
from hyperpod_agent.controller.store.rows import ActionRow
from hyperpod_agent.reasons import SPARE
from hyperpod_agent.simulate.cluster import Cluster, JobState, NodeState, Role


def index_of(name: str) -> int:
    """Node names are ``n`` and the index (cluster.py)."""
    return int(name[1:])


def take_out(
    cluster: Cluster, job: JobState | None, i: int, reason: str, now: float, shrink: bool = False
) -> None:
    """Out of service under ``reason``. Slurm keeps listing the node among an ended job's
    nodes until the job runs again; a step retry's ``shrink`` removes it at once."""
    n = cluster.nodes[i]
    n.role, n.reason, n.reason_time = Role.OUT, reason, now
    if job is not None and shrink:
        job.nodes.discard(i)


def action_row(cluster: Cluster, a: PlannedAction, state: str, now: float) -> ActionRow:
    return ActionRow(
        cluster.next_id(), a.kind.value, a.node, a.job_id, a.reason, a.cause, dict(a.params),
        state, 1, now, now, now, "",
    )  # fmt: skip


def bring_in(cluster: Cluster, i: int, now: float) -> None:
    """A spare (or a repaired node) into service, idle until a job takes it."""
    n = cluster.nodes[i]
    n.role, n.reason, n.reason_time = Role.IDLE, "", now
    n.held = n.replaced = False


def to_pool(n: NodeState, now: float) -> None:
    n.role, n.reason, n.reason_time = Role.SPARE, SPARE, now
    n.held = n.replaced = False


def apply_node_action(
    cluster: Cluster,
    job: JobState | None,
    a: PlannedAction,
    now: float,
    reboot_s: Callable[[], float],
) -> float | None:
    """Carry out one node action; returns when a reboot it started ends (else None)."""
    if a.node is None:
        return None
    i = index_of(a.node)
    n = cluster.nodes[i]
    if a.kind is Kind.RESUME:
        bring_in(cluster, i, now)
        return None
    if a.kind is Kind.DRAIN:  # a drain, or a drain for the agent's GPU reset
        take_out(cluster, job, i, a.reason, now)
        return None
    if a.kind is Kind.REBOOT:
        take_out(cluster, job, i, a.reason, now)
        n.rebooting_until = now + reboot_s()
        n.reboot_row = action_row(cluster, a, "applied", now)
        return n.rebooting_until
    if a.kind in (Kind.REPLACE, Kind.HOLD):
        take_out(cluster, job, i, a.reason, now)
        n.held = True
        spare = a.params.get("spare")
        if a.kind is Kind.REPLACE and spare:
            bring_in(cluster, index_of(str(spare)), now)
            n.replaced = True
        n.done.append(action_row(cluster, a, "done", now))
        return None
    return None  # CHECK, FINDING, CANCEL: not modelled (deep checks and hangs are off)


def reboot_done(cluster: Cluster, i: int, now: float) -> None:
    """The reboot ended: the node booted, the action is done (escalation counts it)."""
    n = cluster.nodes[i]
    row = n.reboot_row
    n.rebooting_until, n.reboot_row, n.boot_time = None, None, now
    if row is not None:
        n.done.append(
            ActionRow(
                row.id,
                row.kind,
                row.node,
                row.job_id,
                row.reason,
                row.cause,
                row.params,
                "done",
                1,
                row.created_at,
                now,
                now,
                "",
            )  # fmt: skip
        )
