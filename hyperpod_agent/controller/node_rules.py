"""The nodes' own rules, one node at a time: a fault's remedy (escalated with its
repeats), a replacement in the loop for a resumable job, an admin's request, a lost
heartbeat. Pure, as ``policy.decide`` that calls them: ``Ctx`` is what a pass derives
once from the snapshot for every rule.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from hyperpod_agent.controller import safety
from hyperpod_agent.controller.config import ControllerConfig, PolicyConfig
from hyperpod_agent.controller.deepcheck import plan as deepcheck_plan
from hyperpod_agent.controller.intents import REBOOT_FLAGS
from hyperpod_agent.controller.replacement import (
    SUPERSEDED,
    SpareFacts,
    SparePool,
    resumable_job_on,
)
from hyperpod_agent.controller.snapshot import (
    Kind,
    NodeHealth,
    PlannedAction,
    PlannedEvent,
    Snapshot,
    left_to_step_retry,
)
from hyperpod_agent.controller.store.rows import ActionRow, FaultRow
from hyperpod_agent.health import Action, Verdict
from hyperpod_agent.reasons import (
    OwnedReason,
    Owner,
    Verb,
    format_reason,
    owner_of,
    parse_admin_request,
)
from hyperpod_agent.slurm.models import Node

log = logging.getLogger(__name__)

IDLE_STATES = ("IDLE", "DOWN", "FAIL")
REMEDIATIONS = ("reboot", "replace")
# CHECK ranks with DRAIN: a drain-only fault on a node waiting for its deep check leaves
# it waiting, under the reason that still asks for the check.
VERB_RANK = {
    Verb.CHECK: 1,
    Verb.DRAIN: 1,
    Verb.RESET: 2,
    Verb.REBOOT: 3,
    Verb.REPLACE: 4,
    Verb.HOLD: 5,
}
# the disk probe's space codes: what users cause by writing, never a lemon's sign
USER_FILLABLE = frozenset({"fs_full", "fs_inodes_full", "fs_space_low", "fs_inodes_low"})
# a probe's finding about its own configuration (config_node_name, config_write_denied):
# the node is as healthy as before, so never a lemon's sign either (docs/probes.md)
CONFIG_PREFIX = "config_"


def _escalated(
    fault: FaultRow,
    history: Sequence[FaultRow],
    done: Sequence[ActionRow],
    policy: PolicyConfig,
    now: float,
) -> Action:
    """RESET -> REBOOT -> REPLACE for each repeat of the component within the window.

    A repeat is another fault of the same component first seen in the window in another
    report, or a reboot/replace we completed on the node after this fault was first
    seen (the fault came back, or never left, after the remedy). A DRAIN is never
    escalated, however often it repeats (a disk users fill again is no reason to
    reboot), nor is it a repeat of another remedy. ``history`` and ``done``: the
    snapshot's rows, or the node's only.
    """
    base = Action(fault.action)
    if base.rank < Action.RESET.rank:
        return base
    since = now - policy.escalation_window_s
    repeats = sum(
        1
        for h in history
        if h.node == fault.node
        and h.component == fault.component
        and h.id != fault.id
        # One report's faults share its time (store.record_report): one occurrence, not
        # repeats. Counted, XID 48 + 79 in one report made a REBOOT-level GPU a REPLACE
        # on first sight (test_policy_properties.ONE_REPORT_TWO_CODES).
        and h.first_seen != fault.first_seen
        and h.first_seen >= since
        and Action(h.action).rank >= Action.RESET.rank
    )
    repeats += sum(
        1
        for a in done
        if a.node == fault.node
        and a.kind in REMEDIATIONS
        and a.updated_at >= fault.first_seen
        and a.updated_at >= since
    )
    action = base
    for _ in range(repeats):
        action = action.escalate()
    return action


# ``owner_of`` is a pure function of the (frozen) node and the Slurm users; each node is
# asked several times a pass (its rules, the urgent nodes, the hang plan), and an
# unchanged node pass after pass, so the answers are kept.
_owner = functools.lru_cache(maxsize=8192)(owner_of)


class Ctx:
    """Per-pass derived state shared by the rules."""

    def __init__(self, snap: Snapshot, config: ControllerConfig, now: float) -> None:
        self.snap, self.config, self.policy, self.now = snap, config, config.policy, now
        self.busy = {a.node for a in snap.in_flight if a.node is not None} | set(snap.checking)
        # a step retry's nodes are the surgery's until it is done or rolled back, and a
        # watched step's nodes are left to the retry it will ask for
        self.busy |= {n for pair in snap.step_retries.values() for n in pair}
        retrying = left_to_step_retry(snap, now) - set(snap.step_retries)
        self.busy |= {n for j in snap.jobs if j.job_id in retrying for n in j.nodes}
        self.faults: dict[str, list[FaultRow]] = defaultdict(list)
        for f in snap.open_faults:
            self.faults[f.node].append(f)
        # Each node's history and completed actions, filed once: the rules read them per
        # node, and a scan of the whole history for every node made a pass quadratic.
        self.history: dict[str, list[FaultRow]] = defaultdict(list)
        for h in snap.history:
            self.history[h.node].append(h)
        self.done: dict[str, list[ActionRow]] = defaultdict(list)
        for a in snap.done:
            if a.node is not None:
                self.done[a.node].append(a)
        self.slurm_users = (config.slurm_user,)
        # Only the spare pool brings another node in; other providers rebuild the same one.
        self.spare_facts = SpareFacts(snap, now)
        self.spares = (
            SparePool(snap, config.policy, now, config.deep_checks, self.spare_facts)
            if config.provider.kind == "spare_pool"
            else None
        )

    def owner(self, node: Node) -> Owner:
        return _owner(node, self.slurm_users)

    def with_spare(self, action: PlannedAction) -> PlannedAction:
        """Promise a spare to a replacement, so two replacements never count on one."""
        if action.kind is not Kind.REPLACE or self.spares is None or "spare" in action.params:
            return action
        failed = self.snap.nodes.get(str(action.node))
        if failed is None:
            return action
        spare = self.spares.take(failed)
        if spare is None:
            return replace(
                action, params={**action.params, "no_spare": self.spares.why_none(failed)}
            )
        return replace(action, params={**action.params, "spare": spare})

    def stale(self, node: Node, health: NodeHealth | None) -> bool:
        """A report generated before the node last booted says nothing about it now."""
        if health is None or health.generated_at is None:
            return True
        return node.boot_time is not None and health.generated_at < node.boot_time.timestamp()

    def actionable(self, node: Node) -> list[tuple[FaultRow, Action]]:
        health = self.snap.health.get(node.name)
        if self.stale(node, health):
            return []
        history, done = self.history.get(node.name, []), self.done.get(node.name, [])
        out = []
        for f in self.faults.get(node.name, []):
            action = _escalated(f, history, done, self.policy, self.now)
            if action.takes_out:
                out.append((f, action))
        return out

    def lemon(self, name: str) -> int:
        """Faults of the node within the lemon window, stragglers it was found to be too.
        A full or filling disk is not counted, nor any fault that asks for a drain only:
        any user can fill what they can write, and that says nothing about the hardware."""
        since = self.now - self.policy.lemon_window_s
        faults = sum(
            1
            for h in self.history.get(name, ())
            if h.first_seen >= since
            and h.code not in USER_FILLABLE
            and not h.code.startswith(CONFIG_PREFIX)
            and h.action != Action.DRAIN.value
        )
        slow = sum(
            1
            for f in self.snap.findings
            if f.kind == "straggler" and f.node == name and f.at >= since
        )
        return faults + slow

    def fresh(self, name: str) -> bool:
        health = self.snap.health.get(name)
        return bool(
            health
            and health.last_seen is not None
            and self.now - health.last_seen <= self.policy.heartbeat_timeout_s
        )

    def heartbeat_lost(self, node: Node) -> bool:
        health = self.snap.health.get(node.name)
        if health is None or health.last_seen is None:
            return False  # never heard of: no agent there, nothing to lose
        if self.now - self.snap.started_at < self.policy.heartbeat_timeout_s:
            return False  # the controller itself just started: give agents time
        return not self.fresh(node.name) and not node.responding


def _worst(items: list[tuple[FaultRow, Action]]) -> tuple[FaultRow, Action]:
    return max(items, key=lambda fa: (fa[1].rank, fa[0].urgent, -fa[0].id))


def _kind_verb(action: Action) -> tuple[Kind, Verb]:
    """REPLACE -> provider; REBOOT -> ``scontrol reboot ASAP``; RESET -> drain so the
    node-local agent can reset the GPU once idle (the controller cannot reach it);
    DRAIN -> drain until the node is healthy again, nothing more."""
    if action is Action.REPLACE:
        return Kind.REPLACE, Verb.REPLACE
    if action is Action.REBOOT:
        return Kind.REBOOT, Verb.REBOOT
    if action is Action.DRAIN:
        return Kind.DRAIN, Verb.DRAIN
    return Kind.DRAIN, Verb.RESET


def _remedy(fault: FaultRow, action: Action, name: str, takes_out: bool) -> PlannedAction:
    """The action for one fault on one node."""
    urgent = fault.urgent
    cause = f"{fault.component} {fault.code}: {fault.message or fault.action}"
    params = {"fault_first_seen": fault.first_seen, "fault_code": fault.code, "fault_id": fault.id}
    kind, verb = _kind_verb(action)
    reason = format_reason(verb, fault.component, fault.code, fault.message)
    return PlannedAction(
        kind, name, reason, cause, urgent=urgent, takes_out=takes_out, params=params
    )


def _replace_in_loop(fault: FaultRow, name: str, job_id: int, spare: str) -> PlannedAction:
    """Replace a node an urgent fault hit under an auto-resume job (HyperPod semantics)."""
    cause = (
        f"urgent {fault.component} {fault.code} under auto-resume job {job_id}: "
        "replace with a spare"
    )
    params = {
        "fault_first_seen": fault.first_seen,
        "fault_code": fault.code,
        "fault_id": fault.id,
        "spare": spare,
        "job_id": job_id,
    }
    reason = format_reason(Verb.REPLACE, fault.component, fault.code, fault.message)
    return PlannedAction(
        Kind.REPLACE, name, reason, cause, urgent=True, takes_out=True, params=params
    )


def _admin(node: Node, verb: Verb) -> list[PlannedAction]:
    reason = format_reason(verb, "admin", "request", node.reason.strip())
    cause = f"admin request {node.reason.strip()!r}"
    kind = Kind.REPLACE if verb is Verb.REPLACE else Kind.REBOOT
    return [PlannedAction(kind, node.name, reason, cause, admin=True)]


def _node_rules(ctx: Ctx, node: Node) -> list[PlannedAction]:
    """Actions for one node; the caller enforces the blast radius."""
    name, reason = node.name, node.reason
    owner = ctx.owner(node)
    if name in ctx.busy or node.flags & REBOOT_FLAGS or owner in (Owner.SPARE, Owner.OTHER):
        return []  # a spare, or a human's or another tool's node: never touched
    if owner is Owner.REQUEST and (verb := parse_admin_request(reason)) is not None:
        return _admin(node, verb)
    ours: OwnedReason | None = safety.parsed_reason(reason) if owner is Owner.US else None
    if ours is not None and ours.verb in (Verb.HOLD, Verb.REPLACE, Verb.SPARE):
        return []  # held for repair, or managed by the provider
    faults = ctx.actionable(node)
    # A drain-only fault never holds a node for repair, whatever its past: the hold
    # would make a disk users filled a repair case.
    remedies = [fa for fa in faults if fa[1] is not Action.DRAIN]
    lemon = bool(remedies) and ctx.lemon(name) >= ctx.policy.lemon_threshold
    out_by_us = node.drained and ours is not None
    if lemon:
        why = f"{ctx.lemon(name)} faults within {ctx.policy.lemon_window_s:g} s"
        f, _ = _worst(remedies)
        return [
            PlannedAction(
                Kind.HOLD,
                name,
                format_reason(Verb.HOLD, f.component, "lemon", why),
                f"lemon: {why}",
                urgent=f.urgent,
                takes_out=not out_by_us,
            )
        ]
    if out_by_us and ours is not None:
        if not faults:
            health = ctx.snap.health.get(name)
            healthy = (
                health is not None
                and health.verdict is Verdict.HEALTHY
                and not ctx.stale(node, health)
            )
            if not (healthy and ctx.fresh(name) and node.responding):
                return []
            deep = ctx.config.deep_checks
            if deepcheck_plan.reentry_gated(ours, deep):
                latest = ctx.snap.check_outcomes.get(name)
                g = deepcheck_plan.gate(node, latest, deep, ctx.now, ctx.snap.checking)
                if g.wait:
                    return []
                if not g.passed:
                    return [deepcheck_plan.reentry_check(node, ours, deep)]
            return [
                PlannedAction(
                    Kind.RESUME,
                    name,
                    "",
                    f"healthy again after {ours.verb.value} {ours.component} {ours.code}",
                )
            ]
        f, action = _worst(faults)
        if VERB_RANK[_kind_verb(action)[1]] > VERB_RANK[ours.verb]:
            # escalated while out (RESET did not help), or a stronger fault arrived
            return [_remedy(f, action, name, takes_out=False)]
        if (
            ours.verb is Verb.RESET
            and action.rank >= Action.RESET.rank  # a drain-only fault left: no timer
            and node.state in IDLE_STATES
            and node.reason_time
            and ctx.now - node.reason_time.timestamp() >= ctx.policy.reset_timeout_s
        ):
            why = f"still faulty {ctx.policy.reset_timeout_s:g} s after drain for reset"
            return [
                PlannedAction(
                    Kind.REBOOT,
                    name,
                    format_reason(Verb.REBOOT, f.component, f.code, why),
                    f"{f.component} {f.code}: {why}",
                )
            ]
        return []
    if faults:
        f, action = _worst(faults)
        if f.urgent and action in SUPERSEDED and ctx.spares is not None:
            job_id = resumable_job_on(name, ctx.snap, ctx.config)
            spare = ctx.spares.take(node) if job_id is not None else None
            if job_id is not None and spare is not None:
                return [_replace_in_loop(f, name, job_id, spare)]
        return [_remedy(f, action, name, takes_out=True)]
    if ctx.heartbeat_lost(node):
        why = f"no heartbeat for > {ctx.policy.heartbeat_timeout_s:g} s and slurmd not responding"
        return [
            PlannedAction(
                Kind.DRAIN,
                name,
                format_reason(Verb.DRAIN, "agent", "heartbeat_lost", why),
                why,
                urgent=True,
                takes_out=True,
            )
        ]
    return []


def plan_nodes(ctx: Ctx) -> tuple[list[PlannedAction], list[PlannedEvent]]:
    """Every node's rules. A node whose rules raise (bad data, a bug) is skipped with an
    event; it never costs the other nodes their pass."""
    planned: list[PlannedAction] = []
    events: list[PlannedEvent] = []
    for name in sorted(ctx.snap.nodes):
        try:
            planned.extend(ctx.with_spare(a) for a in _node_rules(ctx, ctx.snap.nodes[name]))
        except Exception as exc:  # noqa: BLE001 - isolate one node's failure
            log.exception("policy: node %s skipped", name)
            events.append(
                PlannedEvent(
                    "policy_error",
                    f"policy: {name} skipped this pass: {type(exc).__name__}: {exc}",
                    node=name,
                    cause=type(exc).__name__,
                )
            )
    return planned, events
