"""The pure policy: ``decide(snapshot, config, now) -> Decision``.

No I/O and no clock: everything comes from the snapshot, so every rule is a table
test. The executor applies the result (DESIGN §1, STYLE rule 5). The nodes' own rules
are ``node_rules.py``; this composes them with the deep checks, the hangs, the safety
limits and auto-resume.
"""

from __future__ import annotations

from hyperpod_agent.controller import autoresume, safety
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.deepcheck import plan as deepcheck_plan
from hyperpod_agent.controller.hangs import judge as hang_rules
from hyperpod_agent.controller.hangs import plan as hang_plan
from hyperpod_agent.controller.hangs.memory import HangMemory
from hyperpod_agent.controller.intents import REBOOT_FLAGS
from hyperpod_agent.controller.node_rules import Ctx, plan_nodes
from hyperpod_agent.controller.replacement import (
    spare_ready,
)
from hyperpod_agent.controller.snapshot import (
    Decision,
    Kind,
    Snapshot,
)
from hyperpod_agent.reasons import (
    SPARE,
    Owner,
)


def decide(
    snap: Snapshot, config: ControllerConfig, now: float, hang_memory: HangMemory | None = None
) -> Decision:
    """Plan this pass's actions from the snapshot. Pure but for ``hang_memory``: what the
    hang judgement remembers between passes (evidence, a first judgement to confirm)."""
    ctx = Ctx(snap, config, now)
    planned, events = plan_nodes(ctx)
    planned = deepcheck_plan.limit_reentry(planned, config.deep_checks, snap.checking)
    ready = {
        n.name
        for n in snap.nodes.values()
        if n.reason.strip() == SPARE
        and spare_ready(n, snap, config.policy, now, facts=ctx.spare_facts) is None
    }
    planned += deepcheck_plan.plan_spare_checks(snap, config.deep_checks, now, ready, ctx.busy)
    hangs, stragglers = hang_rules.judge(snap, config.progress, now, hang_memory)
    # The hang plan comes after the nodes' own rules: it leaves alone what they act on
    # this pass (a spare promised included) and what Slurm is rebooting.
    acted = {str(n) for a in planned for n in (a.node, a.params.get("spare")) if n}
    acted |= {str(n) for a in planned if a.kind is Kind.CHECK for n in a.params.get("nodes", ())}
    rebooting = {n.name for n in snap.nodes.values() if n.flags & REBOOT_FLAGS}
    found, hung = hang_plan.plan(
        snap, config, hangs, stragglers, ctx.owner, ctx.busy | acted | rebooting, now
    )
    planned += found
    planned, shared = safety.shared_causes(
        planned, snap.open_faults, snap.burst_peers, config.policy, now
    )
    limits = safety.limit_take_outs(snap, config.policy, planned)
    planned = limits.allowed
    # Auto-resume reads the urgent nodes among its jobs' nodes only, so no other node's
    # faults are escalated for it (a node held for repair stays in view for days).
    on_jobs = {name for j in snap.jobs for name in j.nodes}
    urgent_nodes = {a.node for a in planned if a.urgent and a.node} | {
        n.name
        for n in snap.nodes.values()
        if n.name in on_jobs
        and ctx.owner(n) is Owner.US
        and any(f.urgent for f, _ in ctx.actionable(n))
    }
    job_actions, job_events = autoresume.plan(
        snap, config, now, urgent_nodes, ctx.faults, planned, hung
    )
    # A shared cause is an incident too: the admin looks at the cause, we act on none.
    why = "; ".join([e.message for e in shared] + ([limits.reason] if limits.incident else []))
    return Decision(
        planned + job_actions,
        events + shared + limits.events + job_events,
        bool(why),
        why,
        hung_jobs=len(hangs),
    )
