"""Checks an open intent passes before it touches Slurm. Pure.

An intent is applied once, maybe much later than planned (a failed Slurm call, a
restart). By then the node may have changed hands: an admin drained it for
maintenance, Slurm marked it down, another tool took it. Every node intent records the
reason the node had when it was planned; it is applied only while the node still has
that reason, or already has the one the intent writes. Anything else is somebody
else's decision since, and the intent is abandoned (the next pass plans afresh).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from hyperpod_agent.controller.snapshot import NODE_KINDS, Kind, PlannedAction
from hyperpod_agent.controller.store.rows import ActionRow
from hyperpod_agent.reasons import Owner, Verb, format_reason, owner_of, parse_reason
from hyperpod_agent.slurm.models import Job, Node

REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"})
NODE_KIND_VALUES = frozenset(k.value for k in NODE_KINDS)
# Owners an intent recorded without the reason it saw may still act on.
LEGACY_OK = (Owner.NONE, Owner.US, Owner.SLURM, Owner.REQUEST)


def touches_node(row: ActionRow) -> bool:
    return row.node is not None and row.kind in NODE_KIND_VALUES


def changed_hands(row: ActionRow, current: Node, slurm_users: Collection[str]) -> str | None:
    """Why ``current`` is no longer the node ``row`` was planned against, or None."""
    now = current.reason.strip()
    seen = row.params.get("seen_reason")
    if not isinstance(seen, str):
        # Recorded before intents kept what they saw: fall back to the owner check.
        owner = owner_of(current, slurm_users)
        return None if owner in LEGACY_OK else f"its reason is now {now!r} ({owner.value}'s)"
    if now in (seen.strip(), row.reason.strip()):
        return None
    return f"its reason changed from {seen.strip()!r} to {now!r} since it was planned"


def too_old(row: ActionRow, now: float, max_age_s: float) -> str | None:
    """Why an intent not yet applied is too old to apply, or None."""
    age = now - row.created_at
    if row.state == "intent" and age > max_age_s:
        return f"not applied within {max_age_s:g} s of being planned ({age:.0f} s)"
    return None


def already_applied(row: ActionRow, nodes: Mapping[str, Node], jobs: Mapping[int, Job]) -> bool:
    """Is the intent visible in Slurm already (applied before a crash)?"""
    node = nodes.get(row.node or "")
    if row.kind in (Kind.DRAIN.value, Kind.HOLD.value):
        return node is not None and node.drained and node.reason.strip() == row.reason.strip()
    if row.kind == Kind.RESUME.value:
        # an admin's resume through the deep-check gate is applied once the node waits
        # under the reason it wrote (``hyperpod:check``)
        if node is None:
            return False
        return not node.drained or (bool(row.reason.strip()) and _same(node, row))
    if row.kind == Kind.REBOOT.value:
        if node is None:
            return False
        rebooted = node.boot_time is not None and node.boot_time.timestamp() > row.created_at
        return bool(node.flags & REBOOT_FLAGS) or rebooted
    if row.kind == Kind.REQUEUE.value:
        job = jobs.get(row.job_id or -1)
        return job is not None and job.restart_count > int(row.params.get("restart_count", 0))
    if row.kind == Kind.CANCEL.value:
        job = jobs.get(row.job_id or -1)
        return job is None or job.state.upper() != "RUNNING"
    return False  # replace: the provider's replace() is idempotent for the same params


def _same(node: Node, row: ActionRow) -> bool:
    return node.reason.strip() == row.reason.strip()


def target(pa: PlannedAction) -> str:
    """What a planned action is about, for messages: the job, or else the node."""
    return f"job {pa.job_id}" if pa.job_id is not None else str(pa.node)


def row_target(row: ActionRow) -> str:
    """What an intent is about, for messages: the job, or else the node."""
    return f"job {row.job_id}" if row.job_id is not None else str(row.node)


def replaced_reason(row: ActionRow) -> str:
    """The reason a node that came back from its replacement waits under for its deep
    check (``hyperpod:check``: the gate resumes it once it passed)."""
    ours = parse_reason(row.reason)
    what = f"{ours.component} {ours.code}" if ours is not None else "a fault"
    return format_reason(Verb.CHECK, "replace", "back", f"replaced for {what}")


def expected_reasons(row: ActionRow) -> tuple[str, ...] | None:
    """The reasons a node intent may find when applied: the one it saw when planned,
    or its own (done before a crash); None for intents recorded without it."""
    seen = row.params.get("seen_reason")
    if not isinstance(seen, str) or not touches_node(row):
        return None
    return (seen, row.reason)
