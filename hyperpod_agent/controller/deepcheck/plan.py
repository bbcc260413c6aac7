"""The deep-check gates (docs/deep-checks.md). Pure: everything from the snapshot.

- Re-entry: a node we took out for a reboot or a repair (``gate_after``), and a node
  out under ``hyperpod:check`` (new from provisioning, back from a replacement, resumed
  by an admin) goes back into service only after a run of the gating checks passed
  since its reason was set and since it booted; until then the policy plans a check
  instead of a resume. Nothing else is gated: a node we have not seen before is not.
- Spares: with the spare gate a spare is ready only while a passing run is younger
  than ``spare_recheck_h`` and newer than its entry into the pool (its reason time) and
  its last boot. Spares without one are checked ahead of need, several in one run.

A run that never reached its node (the reservation or the job could not be started)
says nothing about the hardware: the node keeps its place and is planned again after
``retry_s``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from hyperpod_agent.controller.config_deep import DeepCheckConfig
from hyperpod_agent.controller.snapshot import Kind, PlannedAction, Snapshot
from hyperpod_agent.controller.store.checks import NodeOutcome
from hyperpod_agent.reasons import SPARE, OwnedReason, Verb
from hyperpod_agent.slurm.models import Node

# a reason time is kept to the second; a run that ended in that second still counts
_CLOCK_SLACK_S = 1.0


@dataclass(frozen=True)
class Gate:
    """Whether ``node`` may take work now as far as deep checks go."""

    passed: bool
    why: str = ""  # when not passed
    wait: bool = False  # a run cannot be planned yet (one is under way, or retry_s)


def _since(node: Node) -> float:
    """The time a passing run must be newer than: the node's reason and its boot."""
    times = [t.timestamp() for t in (node.reason_time, node.boot_time) if t is not None]
    return max(times) - _CLOCK_SLACK_S if times else 0.0


def gate(
    node: Node,
    latest: NodeOutcome | None,
    deep: DeepCheckConfig,
    now: float,
    checking: Collection[str],
    max_age_s: float | None = None,
) -> Gate:
    """Has ``node`` passed a run recent enough? (Its latest outcome is ``latest``.)"""
    if node.name in checking:
        return Gate(False, "a deep check is running", wait=True)
    if latest is None:
        return Gate(False, "no deep check yet")
    age = now - latest.at
    if latest.at < _since(node):
        return Gate(False, "no deep check since it was last taken out or booted")
    if latest.outcome == "OK":
        if max_age_s is not None and age > max_age_s:
            return Gate(False, f"its last deep check is {age / 3600:.1f} h old")
        return Gate(True)
    if not latest.ran:
        why = f"its last deep check could not run: {latest.cause}"
        return Gate(False, why, wait=age < deep.retry_s)
    return Gate(False, f"deep check {latest.check} {latest.outcome}: {latest.cause}", wait=True)


def reentry_gated(ours: OwnedReason, deep: DeepCheckConfig) -> bool:
    """Is a node out for this reason of ours gated on a deep check before it resumes?
    ``hyperpod:check`` always is while the re-entry gate is on: it says so."""
    if not deep.reentry_gate_on:
        return False
    return ours.verb is Verb.CHECK or ours.verb.value in deep.gate_after


def reentry_check(node: Node, ours: OwnedReason, deep: DeepCheckConfig) -> PlannedAction:
    """The run that stands between ``node`` and its resume."""
    if ours.verb is Verb.CHECK:
        cause = f"deep check before it takes work ({ours.component} {ours.code})"
    else:
        cause = f"deep check before resuming after {ours.verb.value} {ours.component} {ours.code}"
    return PlannedAction(
        Kind.CHECK,
        node.name,
        "",
        cause,
        params={
            "nodes": [node.name],
            "level": deep.reentry_level,
            "purpose": "reentry",
            "prior": {node.name: node.reason},
        },
    )


def limit_reentry(
    planned: Sequence[PlannedAction], deep: DeepCheckConfig, checking: Collection[str]
) -> list[PlannedAction]:
    """Drop the re-entry runs beyond ``max_nodes_per_run`` nodes under check at once
    (those checking now included): a wave of new or replaced nodes is checked a batch
    at a time; the rest stay drained and are planned again on a later pass."""
    room = deep.max_nodes_per_run - len(checking)
    kept: list[PlannedAction] = []
    for action in planned:
        if action.kind is Kind.CHECK and action.params.get("purpose") == "reentry":
            if room <= 0:
                continue
            room -= len(action.params["nodes"])
        kept.append(action)
    return kept


def spare_gate(
    node: Node,
    outcomes: Mapping[str, NodeOutcome],
    deep: DeepCheckConfig,
    now: float,
    checking: Collection[str],
) -> Gate:
    if not deep.spare_gate_on:
        return Gate(True)
    latest = outcomes.get(node.name)
    return gate(node, latest, deep, now, checking, max_age_s=deep.spare_recheck_h * 3600.0)


def plan_spare_checks(
    snap: Snapshot,
    deep: DeepCheckConfig,
    now: float,
    ready: Collection[str],
    busy: Collection[str],
) -> list[PlannedAction]:
    """Runs for the spares in ``ready`` (responding, vouched for by their agent) that are
    not qualified: one run per partition, ``max_nodes_per_run`` nodes at most."""
    if not deep.spare_gate_on:
        return []
    by_part: dict[str, list[Node]] = defaultdict(list)
    for name in sorted(ready):
        node = snap.nodes.get(name)
        if node is None or node.reason.strip() != SPARE or name in busy:
            continue
        g = spare_gate(node, snap.check_outcomes, deep, now, snap.checking)
        if g.passed or g.wait:
            continue
        by_part[node.partitions[0] if node.partitions else ""].append(node)
    out = []
    for part, nodes in sorted(by_part.items()):
        for i in range(0, len(nodes), deep.max_nodes_per_run):
            group = nodes[i : i + deep.max_nodes_per_run]
            names = [n.name for n in group]
            out.append(
                PlannedAction(
                    Kind.CHECK,
                    None,
                    "",
                    f"qualifying spare(s) {', '.join(names)} before they are needed",
                    params={
                        "nodes": names,
                        "level": deep.spare_level,
                        "purpose": "spare",
                        "prior": {n.name: n.reason for n in group},
                        "partition": part,
                    },
                )
            )
    return out
