"""How far automation may go in one pass: shared causes and the blast radius. Pure.

Two rules stand between the node rules and Slurm (DESIGN §7):

- **Shared cause.** The same fault code confirmed on ``shared_cause_min_nodes`` nodes
  within ``shared_cause_window_s`` of each other is one cause (a hung filesystem, a
  switch, a bad probe), not many broken nodes: none of them is taken out for it. A
  non-urgent fault waits that window before its take-out, so the burst is seen before
  the first node leaves; an urgent one is acted on at once while no other node shows
  the same code, and waits like the others once one does: at most one node leaves for
  a shared cause before it is plain. A burst stays one when some of its nodes come
  back clean (the one acted on at once, rebooted): their closed faults still count.
- **Blast radius**, per partition: nodes unavailable (drained by anyone, down, not
  responding), nodes already on their way out (an open drain, hold, reboot or replace
  intent; under a deep check; the bad node of a step retry under way) plus new
  take-outs may not exceed ``max_unhealthy_fraction`` of the partition. A partition
  over its limit takes out nothing new in this pass (incident mode); other partitions
  are not affected. A node held for repair whose spare came in no longer counts: the
  spare took its place.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hyperpod_agent.controller.config import PolicyConfig
from hyperpod_agent.controller.snapshot import PlannedAction, PlannedEvent, Snapshot
from hyperpod_agent.controller.store.rows import FaultRow
from hyperpod_agent.health import Action
from hyperpod_agent.reasons import SPARE, Verb, parse_reason
from hyperpod_agent.slurm.models import Node

# ``parse_reason`` for the rules that read every node's reason each pass: a pure function
# of a string, and a cluster has few distinct reasons, so each is parsed once.
parsed_reason = functools.lru_cache(maxsize=4096)(parse_reason)


def counted(action: PlannedAction) -> bool:
    """Does the action take capacity out (subject to these limits)? Admin requests are
    exempt; a replacement with a spare promised is capacity for capacity."""
    return action.takes_out and not action.admin and not action.params.get("spare")


def _burst(fault: FaultRow, faults: Iterable[FaultRow], window: float) -> set[str]:
    return {
        f.node
        for f in faults
        if f.code == fault.code
        and Action(f.action).takes_out
        and abs(f.first_seen - fault.first_seen) <= window
    }


def shared_causes(
    planned: Sequence[PlannedAction],
    open_faults: Sequence[FaultRow],
    closed_peers: Sequence[FaultRow],
    policy: PolicyConfig,
    now: float,
) -> tuple[list[PlannedAction], list[PlannedEvent]]:
    """Drop take-outs for a shared cause, and non-urgent ones still in the window."""
    window = policy.shared_cause_window_s
    if window <= 0:
        return list(planned), []  # switched off
    by_id = {f.id: f for f in open_faults}
    burst_of = [*open_faults, *closed_peers]
    kept: list[PlannedAction] = []
    shared: dict[str, set[str]] = defaultdict(set)
    for action in planned:
        fault = by_id.get(int(action.params.get("fault_id", -1)))
        # Any take-out for the fault, a replacement with a spare included: swapping
        # healthy nodes for a shared cause only spends the pool.
        if fault is None or not action.takes_out or action.admin:
            kept.append(action)
            continue
        burst = _burst(fault, burst_of, window)
        if len(burst) >= policy.shared_cause_min_nodes:
            shared[fault.code] |= burst
        elif (action.urgent and len(burst) == 1) or now - fault.first_seen >= window:
            kept.append(action)
        # else: too young to tell whether others share it; the next pass looks again
    events = [
        PlannedEvent(
            "shared_cause",
            f"shared cause: {code} on {len(nodes)} nodes within {window:g} s "
            f"({', '.join(sorted(nodes))}); taking none of them out",
            cause=f"{code} on {len(nodes)} nodes",
        )
        for code, nodes in sorted(shared.items())
    ]
    return kept, events


def unavailable(node: Node, replaced: Collection[str]) -> bool:
    """Out of service for any reason, unless it is held for repair under our replace
    reason and its spare came in."""
    if not (node.drained or not node.responding):
        return False
    ours = parsed_reason(node.reason)
    return not (node.name in replaced and ours is not None and ours.verb is Verb.REPLACE)


@dataclass(frozen=True)
class Limits:
    """The per-partition outcome of :func:`limit_take_outs`."""

    allowed: list[PlannedAction]
    events: list[PlannedEvent]
    over: dict[str, str]  # partition -> why it is over its limit

    @property
    def incident(self) -> bool:
        return bool(self.over)

    @property
    def reason(self) -> str:
        return "; ".join(self.over[p] for p in sorted(self.over))


def _members(nodes: Mapping[str, Node]) -> dict[str, list[Node]]:
    members: dict[str, list[Node]] = defaultdict(list)
    for node in nodes.values():
        if node.reason.strip() == SPARE:
            continue  # the pool is capacity in waiting, not part of the partition's share
        for part in node.partitions:
            members[part].append(node)
    return members


def allowed_out(policy: PolicyConfig, size: int) -> int:
    """How many of a partition's ``size`` nodes may be unavailable."""
    return max(policy.min_unhealthy_nodes, math.floor(policy.max_unhealthy_fraction * size))


TAKE_OUT_INTENTS = frozenset({"drain", "hold", "reboot", "replace"})


def on_the_way_out(snap: Snapshot) -> frozenset[str]:
    """Nodes that Slurm may still show in service but that are already being taken out:
    an open take-out intent, a deep check under way, the bad node of a step retry."""
    leaving = {
        a.node
        for a in snap.in_flight
        # a replacement with its spare promised is capacity for capacity (``counted``)
        if a.node and a.kind in TAKE_OUT_INTENTS and not a.params.get("spare")
    }
    leaving |= set(snap.checking)
    leaving |= {bad for bad, _ in snap.step_retries.values() if bad}
    return frozenset(leaving)


def _drain_only(reason: str) -> bool:
    """Our drain that never becomes a reboot, for what users can cause: a full disk.
    Not a lost heartbeat's (``agent``: the node is dead) nor a hang suspect's
    (``job<J>``: shown by the node itself): those are out like any other node."""
    ours = parsed_reason(reason)
    if ours is None or ours.verb is not Verb.DRAIN:
        return False
    return ours.component != "agent" and not ours.component.startswith("job")


def _user_fillable(node: Node) -> bool:
    """Out under a drain-only reason and still responding: a dead node drained for a
    full disk is out of service all the same."""
    return _drain_only(node.reason) and node.responding


def limit_take_outs(
    snap: Snapshot, policy: PolicyConfig, planned: Sequence[PlannedAction]
) -> Limits:
    """Keep the take-outs each partition can afford; drop all of an over partition's.

    Drain-only take-outs (``hyperpod:drain``: a full disk, which any user can cause) are
    limited like the others, but they never hold back the remedy of a real fault: for
    any other take-out, nodes out under a drain-only reason do not count. So a user who
    fills disks costs at most the partition's share and cannot stop remediation."""
    view = _View(snap)
    hard = [a for a in planned if not _drain_only(a.reason)]
    kept, events, over = _limit(view, policy, hard, lambda n: not _user_fillable(n))
    soft = [a for a in planned if _drain_only(a.reason)]
    # the drain-only ones fit in what is left once this pass's real take-outs are in
    taken = frozenset(str(a.node) for a in kept if counted(a))
    kept_soft, events_soft, over_soft = _limit(view, policy, soft, lambda n: True, taken)
    allowed = [a for a in planned if a in kept or a in kept_soft]
    return Limits(allowed, events + events_soft, {**over_soft, **over})


class _View:
    """What both limits (real and drain-only take-outs) read of the snapshot, derived
    once: the partitions' members, the nodes on their way out, each node's
    :func:`unavailable` (asked of every member by each limit)."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.members = _members(snap.nodes)
        self.leaving = on_the_way_out(snap)
        self._unavailable: dict[int, tuple[Node, bool]] = {}

    def unavailable(self, node: Node) -> bool:
        # keyed by identity, the node kept alongside: a node object is judged once
        known = self._unavailable.get(id(node))
        if known is not None and known[0] is node:
            return known[1]
        out = unavailable(node, self.snap.replaced)
        self._unavailable[id(node)] = (node, out)
        return out


def _limit(
    view: _View,
    policy: PolicyConfig,
    planned: Sequence[PlannedAction],
    counts: Callable[[Node], bool],
    taken: frozenset[str] = frozenset(),
) -> tuple[list[PlannedAction], list[PlannedEvent], dict[str, str]]:
    """The blast-radius rule over ``planned``, counting the out nodes ``counts`` accepts
    and the ``taken`` ones of this pass."""
    snap, members, leaving = view.snap, view.members, view.leaving

    def gone(node: Node) -> bool:
        out_now = view.unavailable(node) or node.name in leaving
        return (out_now and counts(node)) or node.name in taken

    # A node already out (or on its way) loses no capacity by being taken out (again).
    new = {
        str(a.node)
        for a in planned
        if counted(a)
        and a.node in snap.nodes
        and not gone(snap.nodes[str(a.node)])
        and not view.unavailable(snap.nodes[str(a.node)])
    }
    # the partitions' out counts, needed only to weigh a new take-out (most passes have
    # none; counting walks every member)
    out: dict[str, int] = {}
    if new:
        out = {part: sum(1 for n in nodes if gone(n)) for part, nodes in members.items()}
    over: dict[str, str] = {}
    while True:
        adding: dict[str, list[str]] = defaultdict(list)
        for name in sorted(new):
            for part in snap.nodes[name].partitions:
                if part in members:
                    adding[part].append(name)
        newly = {
            part: names
            for part, names in adding.items()
            if out[part] + len(names) > allowed_out(policy, len(members[part]))
        }
        if not newly:
            break
        for part, names in newly.items():
            limit = allowed_out(policy, len(members[part]))
            over[part] = (
                f"partition {part}: {out[part]} node(s) unavailable and {len(names)} more "
                f"faulty of {len(members[part])}; limit {limit} (max_unhealthy_fraction "
                f"{policy.max_unhealthy_fraction:g})"
            )
            new -= set(names)
    dropped = {
        str(a.node)
        for a in planned
        if counted(a) and a.node in snap.nodes and str(a.node) not in new
        if not gone(snap.nodes[str(a.node)]) and not view.unavailable(snap.nodes[str(a.node)])
    }
    events = []
    if over:
        why = "; ".join(over[p] for p in sorted(over))
        events.append(
            PlannedEvent(
                "incident",
                f"incident mode: {why}; not taking out {', '.join(sorted(dropped))}",
                cause=why,
            )
        )
    allowed = [a for a in planned if not (counted(a) and str(a.node) in dropped)]
    return allowed, events, over
