"""What must hold for any pass of the policy, written from the docs (docs/controller.md,
docs/auto-resume.md, docs/deep-checks.md), not from the code under test.

Each property takes a :class:`Case` (a snapshot, a config, and whose each node was made
to be) and the :class:`Decision` ``decide`` returned for it, and counts from those two
only: what the snapshot says is out or busy, what the actions do. None of them asks
``safety``, ``owner_of``, ``_escalated`` or ``spare_ready`` how to count.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from ctl_helpers import NOW
from policy_case import (
    OURS,
    SPARE_REASON,
    Case,
    busy,
    current_report,
    left_to_surgery,
    not_responding,
    our_verb,
    touched,
    unavailable,
)

from hyperpod_agent.controller.snapshot import Decision, Kind, PlannedAction, Snapshot
from hyperpod_agent.controller.store.rows import FaultRow
from hyperpod_agent.health import Action, Verdict
from hyperpod_agent.slurm.models import Node

NODE_ACTIONS = (Kind.DRAIN, Kind.RESUME, Kind.REBOOT, Kind.REPLACE, Kind.HOLD)
TAKES_OUT = (Kind.DRAIN, Kind.REBOOT, Kind.REPLACE, Kind.HOLD)
JOB_ACTIONS = (Kind.REQUEUE, Kind.EXHAUST, Kind.NOT_RETRIED, Kind.CANCEL)
# docs/controller.md "Lemon": the disk probe's space codes say what users wrote
SPACE_CODES = {"fs_full", "fs_inodes_full", "fs_space_low", "fs_inodes_low"}


# -- reading a case ------------------------------------------------------------------------
def cap_of(s: Snapshot, job_id: int, default: int) -> int | None:
    """The job's budget: its --auto-resume=N, or what an agent of one of its nodes saw;
    N = 1 is the plain switch and gets ``default``; None when it did not opt in."""
    j = next(j for j in s.jobs if j.job_id == job_id)
    seen = [h.jobs_opted_in.get(job_id, 0) for n in j.nodes if (h := s.health.get(n))]
    cap = max([j.auto_resume or 0, *seen])
    return None if cap <= 0 else default if cap == 1 else cap


def from_hang_plan(a: PlannedAction) -> bool:
    """A hang's suspect taken out, or a straggler held after its job (hangs/plan.py):
    by the reason they write, ``hyperpod:<verb> job<J> hang|straggler ...``."""
    words = a.reason.split(" ")
    return len(words) > 2 and words[1].startswith("job") and words[2] in ("hang", "straggler")


# -- the properties ------------------------------------------------------------------------
def hands_off(case: Case, d: Decision) -> None:
    """A human's (or another tool's) node is never touched; a spare only by a check that
    qualifies it or as the spare a replacement brings in."""
    for a in d.actions:
        for name in touched(a):
            assert case.roles[name] != "human", (name, a)
        if a.kind in NODE_ACTIONS:
            assert case.roles[str(a.node)] != "spare", a
        if a.params.get("spare"):
            assert case.roles[str(a.params["spare"])] == "spare", a


def leaves_busy_nodes_alone(case: Case, d: Decision) -> None:
    """No action on, and no spare promised from, a node that is ``busy``."""
    held = busy(case.snap)
    for a in d.actions:
        hit = touched(a) & held
        assert not hit, (sorted(hit), a)


def once_per_node_and_job(case: Case, d: Decision) -> None:
    """No node acted on twice in one decision (a promised spare included); no job given
    two verdicts (requeue, exhaust, not retried, cancel)."""
    nodes = Counter(n for a in d.actions for n in touched(a))
    for name in (n for n, count in nodes.items() if count > 1):
        acts = [a for a in d.actions if name in touched(a)]
        raise AssertionError(f"{name} acted on {len(acts)} times: {acts}")
    jobs = Counter(a.job_id for a in d.actions if a.kind in JOB_ACTIONS)
    assert all(c == 1 for c in jobs.values()), jobs


def user_fillable(n: Node) -> bool:
    """Out under the drain of a fault asking DRAIN (a full disk: docs/security.md), still
    responding: what any user can cause, so it never holds back a real fault's remedy.
    Not a lost heartbeat (``agent``) nor a hang's suspect (``job<J>``): those are out of
    service like any other node (docs/controller.md, "Blast radius")."""
    if our_verb(n) != "drain":
        return False
    component = (n.reason.strip().split(" ") + ["", ""])[1]
    return not not_responding(n) and component != "agent" and not component.startswith("job")


def within_blast_radius(case: Case, d: Decision) -> None:
    """Per partition (spares not counted): nodes out now or on their way out, plus this
    pass's take-outs, stay within max(min_unhealthy_nodes, floor(fraction x size)) when
    the pass takes any node out there. Out: drained by anyone, down or not responding
    (not a node held under our replace reason whose spare came in); on the way out: an
    open drain/hold/reboot/replace intent without a spare, a deep check, the bad node of
    a step retry. A take-out: DRAIN/REBOOT/HOLD, or REPLACE without a spare, of a node
    in service. A drain-only take-out (``hyperpod:drain``) is limited like any other,
    after this pass's other take-outs; nodes out for a full disk (``user_fillable``)
    never hold back another remedy."""
    s, p = case.snap, case.config.policy
    leaving = {
        a.node for a in s.in_flight
        if a.node and a.kind in ("drain", "hold", "reboot", "replace") and not a.params.get("spare")
    } | set(s.checking) | {bad for bad, _ in s.step_retries.values()}  # fmt: skip

    def out(n: Node) -> bool:
        spare_in = n.name in s.replaced and our_verb(n) == "replace"
        return (unavailable(n) and not spare_in) or n.name in leaving

    taken = [
        a for a in d.actions
        if a.kind in TAKES_OUT and not (a.kind is Kind.REPLACE and a.params.get("spare"))
        and not out(s.nodes[str(a.node)])
    ]  # fmt: skip
    drains = {str(a.node) for a in taken if a.reason.startswith(f"{OURS}drain ")}
    others = {str(a.node) for a in taken if not a.reason.startswith(f"{OURS}drain ")}
    for part in sorted({q for n in s.nodes.values() for q in n.partitions}):
        members = [n for n in s.nodes.values() if part in n.partitions]
        members = [n for n in members if n.reason.strip() != SPARE_REASON]
        limit = max(p.min_unhealthy_nodes, math.floor(p.max_unhealthy_fraction * len(members)))
        gone = {n.name for n in members if out(n)}
        fillable = {n.name for n in members if out(n) and user_fillable(n)}
        hard = {n.name for n in members if n.name in others}
        soft = {n.name for n in members if n.name in drains} - hard
        if hard:
            assert len((gone - fillable) | hard) <= limit, (part, sorted(gone), hard, limit)
        if soft:
            assert len(gone | hard | soft) <= limit, (part, sorted(gone), hard, soft, limit)


def repeats(s: Snapshot, f: FaultRow, window: float) -> int:
    """How often ``f`` repeated: other faults of its node and component, asking RESET or
    more, first seen within the window and in another report than ``f`` (faults one
    report opens carry its time: they are one occurrence, not a repeat); and reboots or
    replacements of the node we completed within the window after ``f`` was first seen."""
    since = NOW - window
    faults = sum(
        1 for h in s.history
        if h.node == f.node and h.component == f.component and h.id != f.id
        and h.first_seen >= since and h.first_seen != f.first_seen
        and Action(h.action).rank >= Action.RESET.rank
    )  # fmt: skip
    remedies = sum(
        1 for a in s.done
        if a.node == f.node and a.kind in ("reboot", "replace")
        and a.updated_at >= max(f.first_seen, since)
    )  # fmt: skip
    return faults + remedies


def in_the_loop(case: Case, f: FaultRow, a: PlannedAction) -> bool:
    """Replacement in the loop (docs/auto-resume.md): an urgent fault asking RESET or
    REBOOT on a node not out by us, under a running job auto-resume will requeue (budget
    left, its nodes not asked for by name), with the spare pool and a spare promised."""
    s, cfg = case.snap, case.config
    if not (f.urgent and f.action in ("RESET", "REBOOT") and a.params.get("spare")):
        return False
    if cfg.provider.kind != "spare_pool" or not cfg.auto_resume.enabled:
        return False
    if our_verb(s.nodes[f.node]) is not None:
        return False
    for j in s.jobs:
        if j.state != "RUNNING" or f.node not in j.nodes or j.extra.get("required_nodes"):
            continue
        cap, t = cap_of(s, j.job_id, cfg.auto_resume.default_attempts), s.tracked.get(j.job_id)
        if cap is not None and (t is None or (t.state != "exhausted" and t.attempts < cap)):
            return True
    return False


def replace_is_earned(case: Case, d: Decision) -> None:
    """A REPLACE that no admin asked for needs an open fault of the node, from a report
    made since its last boot, that earns it: the fault asks for REPLACE itself; or it
    asks for REBOOT and repeated once, or for RESET and repeated twice (``repeats``:
    RESET -> REBOOT -> REPLACE, one step a repeat; DRAIN and MONITOR never escalate);
    or it is replaced in the loop (``in_the_loop``). So one report of REBOOT-level
    faults earns a REPLACE only in the loop, however many codes it carries."""
    s, window = case.snap, case.config.policy.escalation_window_s
    need = {Action.REPLACE: 0, Action.REBOOT: 1, Action.RESET: 2}
    for a in d.actions:
        if a.kind is not Kind.REPLACE or case.roles[str(a.node)] == "admin":
            continue
        assert current_report(s, str(a.node)) is not None, a
        faults = [f for f in s.open_faults if f.node == a.node]
        earned = [
            f for f in faults
            if (Action(f.action) in need and repeats(s, f, window) >= need[Action(f.action)])
            or in_the_loop(case, f, a)
        ]  # fmt: skip
        assert earned, (a, faults)


def reboot_is_earned(case: Case, d: Decision) -> None:
    """A REBOOT no admin asked for needs: an open fault of the node, from a report made
    since its last boot, asking REBOOT, or RESET and repeated once; or the node out under
    our reset reason, idle, for reset_timeout_s with such a fault still open (RESET or
    more); or, with suspect_action reboot, a hang's suspect: a rank on the node stuck
    (D state) or an open fault asking RESET or more."""
    s, cfg = case.snap, case.config
    for a in (a for a in d.actions if a.kind is Kind.REBOOT):
        n = s.nodes[str(a.node)]
        if case.roles[n.name] == "admin":
            continue
        faults = [f for f in s.open_faults if f.node == n.name]
        serious = [f for f in faults if Action(f.action).rank >= Action.RESET.rank]
        window = cfg.policy.escalation_window_s
        asked = current_report(s, n.name) is not None and any(
            f.action == "REBOOT" or repeats(s, f, window) >= 1 for f in serious
        )
        idle_for = NOW - n.reason_time.timestamp() if n.reason_time else 0.0
        timed_out = our_verb(n) == "reset" and n.state in ("IDLE", "DOWN", "FAIL")
        timed_out = timed_out and idle_for >= cfg.policy.reset_timeout_s and bool(serious)
        h = s.health.get(n.name)
        stuck = any(r.proc_state == "D" for p in (h.progress if h else ()) for r in p.ranks)
        suspect = cfg.progress.suspect_action == "reboot" and (stuck or bool(serious))
        assert asked or timed_out or suspect, (a, faults)


def hold_is_earned(case: Case, d: Decision) -> None:
    """A HOLD needs a lemon: an open fault asking RESET or more, and lemon_threshold or
    more of the node's faults first seen within lemon_window_s (not those asking DRAIN,
    nor the disk's space codes) and straggler findings; or, with
    straggler_hold_after_job, a straggler finding for the node."""
    s, p = case.snap, case.config.policy
    since = NOW - p.lemon_window_s
    for a in (a for a in d.actions if a.kind is Kind.HOLD):
        name = str(a.node)
        faults = [
            f for f in s.history
            if f.node == name and f.first_seen >= since
            and f.action != Action.DRAIN.value and f.code not in SPACE_CODES
        ]  # fmt: skip
        slow = [f for f in s.findings if f.kind == "straggler" and f.node == name and f.at >= since]
        score = len(faults) + len(slow)
        remedy = any(
            f.node == name and Action(f.action).rank >= Action.RESET.rank for f in s.open_faults
        )
        lemon = remedy and score >= p.lemon_threshold
        straggler = case.config.progress.straggler_hold_after_job and any(
            f.kind == "straggler" and f.node == name for f in s.findings
        )
        assert lemon or straggler, (a, score)


def vouched(case: Case, n: Node) -> bool:
    """Its agent heard within heartbeat_timeout_s, its report HEALTHY and made since boot."""
    h, limit = current_report(case.snap, n.name), case.config.policy.heartbeat_timeout_s
    return bool(h and h.verdict is Verdict.HEALTHY and h.last_seen and NOW - h.last_seen <= limit)


def checked(case: Case, n: Node, max_age: float = math.inf) -> bool:
    """A passing deep check of the node newer than its reason and boot, and ``max_age``."""
    c, times = case.snap.check_outcomes.get(n.name), [n.reason_time, n.boot_time]
    since = max([t.timestamp() for t in times if t], default=0.0) - 1.0  # whole seconds
    return c is not None and c.outcome == "OK" and since <= c.at and NOW - c.at <= max_age


def spares_are_ready(case: Case, d: Decision) -> None:
    """A spare promised to a replacement (docs/controller.md, "Ready spares"): in the
    pool, responding, ``vouched`` for, no open fault, sharing a partition with the node it
    replaces; with spares gated, ``checked`` within spare_recheck_h."""
    s, deep = case.snap, case.config.deep_checks
    for a in (a for a in d.actions if a.params.get("spare")):
        spare, failed = s.nodes[str(a.params["spare"])], s.nodes[str(a.node)]
        assert spare.reason.strip() == SPARE_REASON and not not_responding(spare), a
        assert vouched(case, spare) and not [f for f in s.open_faults if f.node == spare.name]
        assert set(spare.partitions) & set(failed.partitions) or not failed.partitions, a
        assert not deep.spare_gate_on or checked(case, spare, deep.spare_recheck_h * 3600), a


def resume_only_ours_and_healthy(case: Case, d: Decision) -> None:
    """RESUME only a node out under our drain/reset/reboot/check reason (never hold or
    replace), responding, ``vouched`` for, no open fault asking DRAIN or more; with the
    re-entry gate on for its reason (``check`` always), ``checked`` since it was taken
    out and booted."""
    s, deep = case.snap, case.config.deep_checks
    for a in (a for a in d.actions if a.kind is Kind.RESUME):
        n = s.nodes[str(a.node)]
        verb = our_verb(n)
        assert verb in ("drain", "reset", "reboot", "check") and not not_responding(n), a
        assert vouched(case, n), a
        assert not [f for f in s.open_faults if f.node == n.name and Action(f.action).takes_out]
        gated = deep.reentry_gate_on and (verb == "check" or verb in deep.gate_after)
        assert not gated or checked(case, n), a


def take_outs_cite_current_faults(case: Case, d: Decision) -> None:
    """An action that cites a fault cites an open fault of its own node that asks for a
    take-out, from a report made since the node last booted; for a fault asking DRAIN,
    never escalated whatever its repeats, the action is a DRAIN."""
    s = case.snap
    for a in d.actions:
        if "fault_id" not in a.params:
            continue
        f = next((f for f in s.open_faults if f.id == a.params["fault_id"]), None)
        assert f is not None and f.node == a.node and Action(f.action).takes_out, (a, f)
        assert current_report(s, f.node) is not None, a
        assert a.kind is Kind.DRAIN or f.action != Action.DRAIN.value, (a, f)


def requeues_within_budget(case: Case, d: Decision) -> None:
    """REQUEUE only an opted-in job, auto-resume on, not exhausted, attempts left, not
    held by a step retry or an open intent, and no more in the pass than the cluster-wide
    cap leaves; EXHAUST only a job whose attempts reached its cap."""
    s, ar = case.snap, case.config.auto_resume
    held = left_to_surgery(s)[0] | {a.job_id for a in s.in_flight if a.job_id is not None}
    requeues = [a for a in d.actions if a.kind is Kind.REQUEUE]
    assert len(requeues) <= max(0, ar.max_requeues_per_minute - s.requeues_last_minute)
    for a in d.actions:
        if a.kind not in (Kind.REQUEUE, Kind.EXHAUST):
            continue
        assert ar.enabled and a.job_id is not None and a.job_id not in held, a
        cap, t = cap_of(s, a.job_id, ar.default_attempts), s.tracked.get(a.job_id)
        assert cap is not None and (t is None or t.state != "exhausted"), (a, t)
        attempts = t.attempts if t else 0
        assert attempts < cap if a.kind is Kind.REQUEUE else attempts >= cap, (a, t)


PROPERTIES: list[Callable[[Case, Decision], None]] = [
    hands_off,
    leaves_busy_nodes_alone,
    once_per_node_and_job,
    within_blast_radius,
    replace_is_earned,
    reboot_is_earned,
    hold_is_earned,
    spares_are_ready,
    resume_only_ours_and_healthy,
    take_outs_cite_current_faults,
    requeues_within_budget,
]
