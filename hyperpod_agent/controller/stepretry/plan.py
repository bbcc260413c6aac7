"""Step retry inside the allocation: what to answer a failed ``srun --auto-resume``. Pure.

A step of a running job failed. It is launched again in the same job (RETRYSTEP) only
when the failure is a node's: one of the step's nodes has an urgent fault (rank RESET
or above, as auto-resume counts them) within ``fault_window_s``, is not responding or
down, or is already out under one of our reasons. And only when a spare can stand in
for that node: a ready spare in the job's own partitions, a job that did not name its
nodes, an in-place budget left, and room under the cluster's limits. A node fault that
cannot be mended in place falls back to the job-level requeue (REQUEUE); anything else
is the application's (FAIL): the step failed on healthy nodes, said "do not restart"
(exit 93) or stopped cleanly (exit 130), was cancelled, or the job did not opt in.

Nothing here comes from the step's helper but its exit code, its attempt and whether
it saw the step cancelled: the step's nodes and start are what Slurm said (api/steps.py),
the budget is the job's own opt-in (``cap_of``), and the retries it paid for are counted
per job.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from hyperpod_agent.controller import safety
from hyperpod_agent.controller.autoresume import NO_RESTART_EXITS, cap_of, required_nodes
from hyperpod_agent.controller.config import AutoResumeConfig, ControllerConfig
from hyperpod_agent.controller.hangs.ending import HangEnd
from hyperpod_agent.controller.replacement import SparePool
from hyperpod_agent.controller.snapshot import Kind, PlannedAction, Snapshot
from hyperpod_agent.controller.store.rows import FaultRow
from hyperpod_agent.health import Action
from hyperpod_agent.reasons import SPARE, Verb, format_reason, parse_reason
from hyperpod_agent.slurm.models import Job, Node

# NVIDIA resiliency-ext's in-job restart: a rank exiting with this asks not to be restarted.
DO_NOT_RESTART = 93
CLEAN_STOP = 130  # the same convention's clean stop (SIGINT): not a failure to mend
# The agent's slurmd probe: the node's slurmd is gone or does not answer.
SLURMD_GONE = ("slurmd_down", "slurmd_unresponsive")


class Outcome(enum.StrEnum):
    RETRYSTEP = "RETRYSTEP"  # launch the step again, in the same job, on the new node list
    REQUEUE = "REQUEUE"  # a node fault mended by the job-level requeue instead
    FAIL = "FAIL"  # not a node's fault: the step's failure stands


@dataclass(frozen=True)
class StepFailure:
    """A step that failed: how it ended (its helper's word), where it ran (Slurm's)."""

    job_id: int
    step_id: str
    exit_code: int
    nodes: tuple[str, ...]  # the step's nodes: Slurm's, when its watch began
    attempt: int  # the attempt that failed, 1 for the first launch
    cancelled: bool = False  # the user cancelled the step (scancel)
    started_at: float | None = None  # when its job started, as Slurm said (epoch)
    hang: HangEnd | None = None  # the hang the controller ended the step for


@dataclass(frozen=True)
class StepPlan:
    """The answer, with what the surgery needs when it is RETRYSTEP."""

    outcome: Outcome
    cause: str
    bad_node: str = ""
    spare: str = ""
    reason: str = ""  # the bad node's drain reason: the replace path's
    keep: tuple[str, ...] = ()  # the job's nodes but the bad one


def budget_of(job: Job, snap: Snapshot, default_attempts: int) -> int:
    """The in-place budget: the job's own opt-in, as requeues have it (``admin_comment``
    from job_submit, or the SPANK plugin's marker reported by an agent of one of the
    job's nodes); ``1`` is the plain switch, worth ``default_attempts``; 0 when the job
    did not opt in. Never a number the step's helper sends."""
    return cap_of(job, snap, default_attempts) or 0


def attributable(name: str, snap: Snapshot, since: float) -> tuple[str, FaultRow | None] | None:
    """Why the step's failure is ``name``'s (and the fault, if one), or None. A closed
    fault counts when it was still seen at ``since`` or later."""

    def recent(f: FaultRow) -> bool:
        serious = Action(f.action).rank >= Action.RESET.rank
        return f.node == name and serious and (f.closed_at is None or f.last_seen >= since)

    faults = sorted(
        {f.id: f for f in [*snap.open_faults, *snap.history] if recent(f)}.values(),
        key=lambda f: (-Action(f.action).rank, not f.urgent, f.id),
    )
    if faults:
        f = faults[0]
        return f"{f.component} {f.code} on {name}", f
    node = snap.nodes.get(name)
    if node is None:
        return None
    if not node.responding:
        return f"{name} not responding ({node.state})", None
    ours = parse_reason(node.reason)
    if node.drained and node.reason.strip() != SPARE and ours is not None:
        return f"{name} out under {node.reason.strip()!r}", None
    return None


def _drain_reason(job_id: int, fault: FaultRow | None, snap_reason: str) -> str:
    """Today's replace reason for the fault; a node out under our reason without an
    open fault keeps the component and code of that reason."""
    if fault is not None:
        return format_reason(Verb.REPLACE, fault.component, fault.code, fault.message)
    ours = parse_reason(snap_reason) if snap_reason else None
    component, code = (ours.component, ours.code) if ours is not None else ("node", "out")
    return format_reason(Verb.REPLACE, component, code, f"step retry of job {job_id}")


def _dead(node: Node | None, fault: FaultRow | None) -> bool:
    """The node no longer runs anything of ours: not responding to slurmctld, or its
    agent found its slurmd gone (reported before slurmctld's own timeout)."""
    if node is not None and not node.responding:
        return True
    return fault is not None and fault.component == "slurmd" and fault.code in SLURMD_GONE


def _hang_reason(job_id: int, name: str, hang: HangEnd) -> str:
    """A hang suspect's reason: the replace path's when the node itself shows why (a
    rank stopped or in uninterruptible sleep); a deep check when only the job's own
    records name it (a rank behind): a user's records never get a node held for
    repair, and a node that passes its check comes back by itself."""
    verb = Verb.REPLACE if name in hang.shown else Verb.CHECK
    return format_reason(verb, f"job{job_id}", "hang", f"hung at step {hang.step}")


def _limits(
    job: Job,
    name: str,
    fault: FaultRow | None,
    snap: Snapshot,
    config: ControllerConfig,
    now: float,
) -> str | None:
    """Why the cluster's limits forbid taking ``name`` out now, or None. The surgery runs
    beside the policy's pass, so its take-out is weighed as a plain drain (spare or not)."""
    params = {"fault_id": fault.id} if fault is not None else {}
    action = PlannedAction(
        Kind.DRAIN, name, "", "step retry", job.job_id, urgent=True, takes_out=True, params=params
    )
    kept, shared = safety.shared_causes(
        [action], snap.open_faults, snap.burst_peers, config.policy, now
    )
    if not kept:
        return shared[0].message if shared else "the fault is too young to tell a shared cause"
    limits = safety.limit_take_outs(snap, config.policy, kept)
    if not limits.allowed:
        return f"blast radius: {limits.reason}"
    return None


def decide_step(
    job: Job,
    failure: StepFailure,
    snap: Snapshot,
    config: ControllerConfig,
    now: float,
    retries_done: int = 0,
    retries_last_minute: int = 0,
) -> StepPlan:
    """RETRYSTEP, REQUEUE or FAIL for ``failure`` of ``job``, with a one-line cause.

    ``retries_done``: in-place retries the store counts for the job (every step of it);
    ``retries_last_minute``: started cluster-wide within the last minute (they share
    the requeue cap)."""
    ar = config.auto_resume
    budget = budget_of(job, snap, ar.default_attempts)
    if not ar.enabled:
        return StepPlan(Outcome.FAIL, "auto-resume is disabled on this cluster")
    if failure.cancelled:
        return StepPlan(Outcome.FAIL, f"step {failure.step_id} was cancelled")
    if failure.exit_code in NO_RESTART_EXITS:  # DO_NOT_RESTART, CLEAN_STOP
        code = failure.exit_code
        return StepPlan(Outcome.FAIL, f"exit {code}: {NO_RESTART_EXITS[code]}")
    # A fault the node was over before this launch began did not end it.
    since = max(now - ar.fault_window_s, failure.started_at or 0.0)
    found = {n: why for n in failure.nodes if (why := attributable(n, snap, since))}
    # A step the controller ended because its job hung, with no node fault to blame:
    # the hang's suspects among its nodes are (no suspect: the job-level requeue).
    hang = failure.hang if not found else None
    if hang is not None:
        found = {n: (f"hang: {hang.cause}", None) for n in hang.suspects if n in failure.nodes}
    # A node of the step that is no longer the job's: Slurm released it because it died
    # (a job submitted with --no-kill lives on without it), else the report is wrong.
    foreign = [n for n in failure.nodes if n not in job.nodes and n not in found]
    if foreign:
        return StepPlan(Outcome.FAIL, f"{','.join(foreign)} not among job {job.job_id}'s nodes")
    if not found and hang is None:
        return StepPlan(
            Outcome.FAIL,
            f"step {failure.step_id} failed (exit {failure.exit_code}) on healthy nodes "
            f"{','.join(failure.nodes)}",
        )
    # Asked after the application's own answers: an srun's opt-in reaches the controller
    # with its node's next report, which a step failing at once may outrun.
    if budget <= 0:
        return StepPlan(Outcome.FAIL, f"job {job.job_id} did not opt in (--auto-resume)")
    what = f"hang: {hang.cause}" if hang is not None else "; ".join(w for w, _ in found.values())
    if job.state.upper() != "RUNNING":
        return StepPlan(Outcome.REQUEUE, f"{what}; job is {job.state.upper()}, not RUNNING")
    if any(a.job_id == job.job_id and a.kind == Kind.REQUEUE.value for a in snap.in_flight):
        return StepPlan(Outcome.REQUEUE, f"{what}; a job-level requeue is under way")
    if not found:
        return StepPlan(Outcome.REQUEUE, f"{what}; no suspect among the step's nodes")
    if len(found) > 1:
        return StepPlan(Outcome.REQUEUE, f"{what}; an in-place retry replaces one node")
    named = required_nodes(job)
    if named:
        return StepPlan(Outcome.REQUEUE, f"{what}; the job named its nodes ({','.join(named)})")
    used = max(failure.attempt - 1, retries_done)
    if used >= budget:
        return StepPlan(Outcome.REQUEUE, f"{what}; in-place budget spent ({used}/{budget})")
    if snap.requeues_last_minute + retries_last_minute >= ar.max_requeues_per_minute:
        cap = ar.max_requeues_per_minute
        return StepPlan(Outcome.REQUEUE, f"{what}; cluster-wide cap ({cap}/min) reached")
    ((bad, (_, fault)),) = found.items()
    batch = job.batch_host
    parked = parked_batch_host(job, snap.nodes)
    node = snap.nodes.get(bad)
    if bad == batch and node is not None and not node.responding:
        # The batch script ran there: the job ended with it (Slurm's rule).
        return StepPlan(Outcome.REQUEUE, f"{what}; the job's batch host is dead")
    if _dead(node, fault):
        # Slurm (22.05) keeps the dead node's part of the step RUNNING, even once the
        # node left the job: no new step gets the other nodes' CPUs ("Requested nodes
        # are busy"). Only ending the job ends that step.
        return StepPlan(Outcome.REQUEUE, f"{what}; the step stays on the dead node in Slurm")
    if hang is not None and bad not in hang.shown and bad == batch:
        # Only the job's records name it: it goes to a deep check, which would wait on
        # the job it is the batch host of.
        return StepPlan(Outcome.REQUEUE, f"{what}; the unclear suspect is the batch host")
    if parked is not None and parked != bad:
        # One node of a job may stay in it only as its batch host, and that one is.
        return StepPlan(
            Outcome.REQUEUE, f"{what}; batch host {parked} is out already (an earlier retry)"
        )
    if snap.expansion_refused:
        # The spare could not be merged in without risking slurmctld itself.
        return StepPlan(Outcome.REQUEUE, f"{what}; {snap.expansion_refused}")
    spare = _spare(bad, job, snap, config, now)
    if spare.startswith("!"):
        return StepPlan(Outcome.REQUEUE, f"{what}; {spare[1:]}")
    refused = _limits(job, bad, fault, snap, config, now)
    if refused is not None:
        return StepPlan(Outcome.REQUEUE, f"{what}; {refused}")
    cause, keep = f"{what}: {spare} stands in", tuple(n for n in job.nodes if n != bad)
    if bad == batch:
        # Slurm never removes a running job's batch host (the node running its batch
        # script): it stays in the job, drained so nothing else lands on it after the
        # job, and the step runs again on the other nodes and the spare.
        cause, keep = f"{cause}; {bad} stays as the batch host only", tuple(job.nodes)
    return StepPlan(
        Outcome.RETRYSTEP,
        cause,
        bad_node=bad,
        spare=spare,
        reason=_hang_reason(job.job_id, bad, hang)
        if hang
        else _drain_reason(job.job_id, fault, node.reason if node else ""),
        keep=keep,
    )


def parked_batch_host(job: Job, nodes: Mapping[str, Node]) -> str | None:
    """The job's batch host when a step retry left it in the job only as that: drained
    under our replace reason. No step of the job runs there again."""
    node = nodes.get(job.batch_host) if job.batch_host else None
    if node is None or not node.drained:
        return None
    ours = parse_reason(node.reason)
    return node.name if ours is not None and ours.verb is Verb.REPLACE else None


def job_partitions(job: Job) -> tuple[str, ...]:
    """The partitions the job runs in, as Slurm names them (a pending job may list several)."""
    return tuple(sorted({p.strip() for p in job.partition.split(",") if p.strip()}))


def _spare(bad: str, job: Job, snap: Snapshot, config: ControllerConfig, now: float) -> str:
    """A ready spare for ``bad`` (replacement.py's pool) in one of the job's own
    partitions, or ``!why`` none is. The spare joins the job: it must be a node the
    job could have been given, whatever partitions the broken node is in as well."""
    if config.provider.kind != "spare_pool":
        return f"!no spare pool (provider {config.provider.kind})"
    failed = snap.nodes.get(bad)
    if failed is None:
        return f"!{bad} is not in Slurm's view"
    parts = job_partitions(job)
    if not parts:
        return f"!Slurm names no partition of job {job.job_id}"
    # the pool matches a spare to the node's partitions; here they are the job's
    as_job = replace(failed, partitions=parts)
    pool = SparePool(snap, config.policy, now, config.deep_checks)
    spare = pool.take(as_job)
    return spare if spare is not None else f"!{pool.why_none(as_job)}"


def backoff_s(previous: Sequence[float], now: float, ar: AutoResumeConfig) -> float:
    """How long a step's relaunch waits, given when its earlier in-place retries were
    ready (oldest first): none for the first; then ``backoff_base_s`` doubling per
    retry up to ``backoff_max_s``, from the last one, as job requeues back off."""
    if not previous:
        return 0.0
    wait = min(ar.backoff_max_s, ar.backoff_base_s * 2.0 ** (len(previous) - 1))
    return max(0.0, float(previous[-1]) + wait - now)
