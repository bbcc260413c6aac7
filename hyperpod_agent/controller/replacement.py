"""Replacement in the loop (HyperPod semantics). Pure.

When an urgent fault hits a node running an auto-resume job, waiting for a reboot
would leave the requeued job short of a node (or send it back to a machine that just
failed). With a spare in the pool the node is replaced instead: the spare comes into
service, the faulty node is held for repair, and the job requeued in the same pass
lands on healthy nodes only.
"""

from __future__ import annotations

from collections import defaultdict

from hyperpod_agent.controller.autoresume import cap_of, required_nodes
from hyperpod_agent.controller.config import ControllerConfig, PolicyConfig
from hyperpod_agent.controller.config_deep import DeepCheckConfig
from hyperpod_agent.controller.deepcheck.plan import spare_gate
from hyperpod_agent.controller.intents import REBOOT_FLAGS
from hyperpod_agent.controller.snapshot import Snapshot, left_to_step_retry
from hyperpod_agent.health import Action, Verdict
from hyperpod_agent.reasons import SPARE
from hyperpod_agent.slurm.models import Node

# Remedies a spare supersedes for a node under an auto-resume job: both leave the job
# short of a node for minutes, and both may put it back on a machine that just failed.
# Not DRAIN: what asks only for a drain (a full disk) is no reason to hold a node for
# repair, which a replacement does.
SUPERSEDED = (Action.RESET, Action.REBOOT)


class SpareFacts:
    """What :func:`spare_ready` reads of the snapshot about any spare, derived once for
    all the spares of a pass (per spare, it made the pool quadratic in the nodes)."""

    def __init__(self, snap: Snapshot, now: float) -> None:
        self.held = held_by_step_retry(snap, now)
        self.acted_on = {a.node for a in snap.in_flight if a.node is not None}
        self.fault_codes: dict[str, list[str]] = defaultdict(list)
        for f in snap.open_faults:
            self.fault_codes[f.node].append(f.code)


def spare_ready(
    node: Node,
    snap: Snapshot,
    policy: PolicyConfig,
    now: float,
    deep: DeepCheckConfig | None = None,
    facts: SpareFacts | None = None,
) -> str | None:
    """Why ``node`` may not be swapped in now, or None when it may: a spare must be
    responding, left to itself (not rebooting, no intent of ours open on it, no deep
    check under way), and its agent's latest verdict healthy, recent and made since its
    last boot, with no open fault; with ``deep`` gating spares, qualified by a deep
    check. A spare nobody vouches for is not put under a job. ``facts`` are the
    snapshot's (built here when not given)."""
    if node.reason.strip() != SPARE:
        return "not a spare"
    if not node.responding:
        return "not responding"
    # A spare something else is doing something to is no spare this pass: the policy
    # leaves such nodes alone, and a promise would put a requeued job on a node about
    # to reboot, be held, be checked or be taken by a step retry (test_policy_properties:
    # LOOP_REBOOTING_SPARE).
    if node.flags & REBOOT_FLAGS:
        return "rebooting"
    if node.name in snap.checking:
        return "a deep check is under way on it"
    if facts is None:
        facts = SpareFacts(snap, now)
    if node.name in facts.acted_on:
        return "an action of ours is under way on it"
    if node.name in facts.held:
        return "a step retry holds it"
    health = snap.health.get(node.name)
    if health is None or health.verdict is None or health.generated_at is None:
        return "no report from its agent"
    if health.verdict is not Verdict.HEALTHY:
        return f"its agent says {health.verdict.value}"
    if health.last_seen is None or now - health.last_seen > policy.heartbeat_timeout_s:
        return f"no word from its agent for > {policy.heartbeat_timeout_s:g} s"
    if node.boot_time is not None and health.generated_at < node.boot_time.timestamp():
        return "its agent has not reported since it booted"
    faults = sorted(facts.fault_codes.get(node.name, ()))
    if faults:
        return f"open faults {', '.join(faults)}"
    if deep is not None:
        qualified = spare_gate(node, snap.check_outcomes, deep, now, snap.checking)
        if not qualified.passed:
            return qualified.why
    return None


def held_by_step_retry(snap: Snapshot, now: float) -> set[str]:
    """The nodes the policy leaves to step retries: a surgery's two nodes, and every node
    of a job whose watched step will ask for its retry (``left_to_step_retry``)."""
    held = {n for pair in snap.step_retries.values() for n in pair}
    watched = left_to_step_retry(snap, now) - set(snap.step_retries)
    return held | {n for j in snap.jobs if j.job_id in watched for n in j.nodes}


class SparePool:
    """The spares ready this pass (see :func:`spare_ready`); each can be promised to one
    replacement."""

    def __init__(
        self,
        snap: Snapshot,
        policy: PolicyConfig,
        now: float,
        deep: DeepCheckConfig | None = None,
        facts: SpareFacts | None = None,
    ) -> None:
        if facts is None:
            facts = SpareFacts(snap, now)
        # each spare judged once; every other node is "not a spare", neither unready as a
        # spare nor free
        judged = [
            (n, spare_ready(n, snap, policy, now, deep, facts))
            for n in snap.nodes.values()
            if n.reason.strip() == SPARE
        ]
        self._unready = {n.name: why for n, why in judged if why}
        self._all = snap.nodes
        # Spares promised to replacements still under way are not free either.
        taken = {str(a.params["spare"]) for a in snap.in_flight if a.params.get("spare")}
        taken |= {spare for _, spare in snap.step_retries.values()}  # going into a job
        self._free = sorted(
            (n for n, why in judged if n.name not in taken and why is None),
            key=lambda n: n.name,
        )

    def why_none(self, failed: Node) -> str:
        """Why no spare could be promised to ``failed`` (for the event)."""
        parts = set(failed.partitions)
        where = ",".join(sorted(parts)) or "-"
        unready = [
            f"{name}: {why}"
            for name, why in sorted(self._unready.items())
            if not parts or parts & set(self._all[name].partitions)
        ]
        if not unready:
            return f"no spare left in partitions {where}"
        return f"no spare ready in partitions {where} ({'; '.join(unready)})"

    def take(self, failed: Node) -> str | None:
        """Promise a spare sharing a partition with ``failed``; None when there is none."""
        parts = set(failed.partitions)
        for spare in self._free:
            if spare.name != failed.name and (not parts or parts & set(spare.partitions)):
                self._free.remove(spare)
                return spare.name
        return None


def resumable_job_on(name: str, snap: Snapshot, config: ControllerConfig) -> int | None:
    """The lowest id of a RUNNING job on ``name`` that auto-resume will requeue and
    that could run on a spare instead of ``name``."""
    ar = config.auto_resume
    if not ar.enabled:
        return None
    for job in sorted(snap.jobs, key=lambda j: j.job_id):
        if job.state.upper() != "RUNNING" or name not in job.nodes:
            continue
        if name in required_nodes(job):
            continue  # asked for this very node (-w): a spare cannot stand in for it
        cap = cap_of(job, snap, ar.default_attempts)
        tracked = snap.tracked.get(job.job_id)
        if cap is None or (
            tracked is not None and (tracked.state == "exhausted" or tracked.attempts >= cap)
        ):
            continue  # no requeue coming: a spare would not help this job
        return job.job_id
    return None
