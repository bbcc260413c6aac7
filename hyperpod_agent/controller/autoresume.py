"""Auto-resume rules: which opted-in jobs to requeue (DESIGN §4). Pure.

A job is opted in when Slurm shows ``--auto-resume=N`` (``Job.auto_resume``, from
``admin_comment``) or an agent saw it on its node (``NodeReport.jobs_opted_in``).
``N`` caps the requeues, except ``1``: the plain HyperPod switch, which gets
``auto_resume.default_attempts``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.snapshot import (
    Kind,
    PlannedAction,
    PlannedEvent,
    Snapshot,
    left_to_step_retry,
)
from hyperpod_agent.controller.store.rows import FaultRow
from hyperpod_agent.errors import SlurmParseError
from hyperpod_agent.health import Action
from hyperpod_agent.reasons import Verb, parse_reason
from hyperpod_agent.slurm.hostlist import expand_hostlist
from hyperpod_agent.slurm.models import Job

log = logging.getLogger(__name__)

MAX_CAP = 1000  # the SPANK option's upper bound

# The application's own word, as NVIDIA resiliency-ext's in-job restart spells it: a
# job or step ending with one of these is not run again, whatever its nodes show.
NO_RESTART_EXITS = {
    93: "the application asked not to restart",
    130: "a clean stop (SIGINT)",
}
SIGINT = 2


def no_restart(job: Job) -> int | None:
    """93 or 130 when the ended ``job`` said not to run it again, else None. A batch
    script killed by SIGINT shows as exit 0 with signal 2 in Slurm: that is 130."""
    if job.exit_code in NO_RESTART_EXITS:
        return job.exit_code
    if job.extra.get("exit_signal") == str(SIGINT):
        return 128 + SIGINT
    return None


def cap_of(job: Job, snap: Snapshot, default_attempts: int) -> int | None:
    """The job's retry budget, or None when it did not opt in."""
    values = [job.auto_resume] if job.auto_resume else []
    # An srun marker counts only from a node the job runs on: any other node's report
    # could otherwise opt any job in.
    values += [
        cap
        for name in job.nodes
        if (h := snap.health.get(name)) is not None and (cap := h.jobs_opted_in.get(job.job_id))
    ]
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    cap = max(values)
    # An agent's report is input: keep the budget within what --auto-resume accepts.
    return default_attempts if cap == 1 else min(cap, MAX_CAP)


def _serious(fault: FaultRow) -> bool:
    """A fault that says the node is broken. MONITOR faults (XID 13, 31, 43...) are
    what a buggy application causes: requeueing for them would loop an application bug."""
    return Action(fault.action).rank >= Action.RESET.rank


def _faulty_nodes(
    job: Job, snap: Snapshot, now: float, window: float, faults: Mapping[str, Sequence[FaultRow]]
) -> list[str]:
    """Nodes of the job that had a fault within the window of its end, or are out by us
    or dead. Measured from the job's end, not from now: Slurm keeps an ended job in
    view for minutes, and a fault that turns up on its node long after it failed did
    not cause the failure (nor may it resurrect the job)."""
    end = job.end_time.timestamp() if job.end_time is not None else now
    # A fault the node was over before the job (this run of it) started did not end it.
    start = job.start_time.timestamp() if job.start_time is not None else end - window

    def near(f: FaultRow) -> bool:
        during = f.first_seen <= end + window
        since = max(end - window, start)
        return during and (f.closed_at is None or f.last_seen >= since) and _serious(f)

    bad = []
    for name in job.nodes:
        node = snap.nodes.get(name)
        recent = any(f.node == name and near(f) for f in snap.history)
        drained_by_us = (
            node is not None
            and node.drained
            and parse_reason(node.reason) is not None
            and (node.reason_time is None or node.reason_time.timestamp() <= end + window)
        )
        if (
            any(near(f) for f in faults.get(name, ()))
            or recent
            or (node is not None and not node.responding)
            or drained_by_us
        ):
            bad.append(name)
    return bad


def _cause(
    job: Job,
    snap: Snapshot,
    config: ControllerConfig,
    now: float,
    urgent_nodes: set[str],
    faults: Mapping[str, Sequence[FaultRow]],
    hung: Mapping[int, str],
) -> str | None:
    state = job.state.upper()
    if state == "RUNNING":
        if job.job_id in hung:  # says more than "urgent" about the suspect taken out
            return hung[job.job_id]
        hit = sorted(set(job.nodes) & urgent_nodes)
        return f"urgent fault on {','.join(hit)}" if hit else None
    if state == "NODE_FAIL":
        return "job ended NODE_FAIL"
    if state == "FAILED":
        bad = _faulty_nodes(job, snap, now, config.auto_resume.fault_window_s, faults)
        if bad:
            return f"job failed (exit {job.exit_code}) while {','.join(bad)} had a fault"
        if config.auto_resume.retry_on == "any_failure":
            return f"job failed (exit {job.exit_code}); retry_on=any_failure"
    return None


# Node actions that take a node out of service in this pass.
TAKING_OUT = (Kind.DRAIN, Kind.HOLD, Kind.REBOOT, Kind.REPLACE)


def job_partitions(job: Job, snap: Snapshot) -> set[str]:
    """Where the requeued job may run: its partition(s), else those of its nodes."""
    named = {p.strip() for p in job.partition.split(",") if p.strip()}
    if named:
        return named
    return {p for n in job.nodes if (node := snap.nodes.get(n)) for p in node.partitions}


def _usable_set(
    job: Job, snap: Snapshot, planned: Sequence[PlannedAction]
) -> tuple[set[str], set[str]]:
    """(usable nodes in the job's partitions, usable nodes anywhere) after this pass."""
    parts = job_partitions(job, snap)
    leaving = {a.node for a in planned if a.node and a.kind in TAKING_OUT}
    coming = {a.node for a in planned if a.node and a.kind is Kind.RESUME}
    coming |= {
        str(a.params["spare"]) for a in planned if a.kind is Kind.REPLACE and a.params.get("spare")
    }
    anywhere = {
        n.name
        for n in snap.nodes.values()
        if n.name not in leaving and (n.name in coming or (not n.drained and n.responding))
    }
    inside = {n for n in anywhere if not parts or parts & set(snap.nodes[n].partitions)}
    return inside, anywhere


def usable_nodes(job: Job, snap: Snapshot, planned: Sequence[PlannedAction]) -> int:
    """Nodes the requeued job could start on once this pass's actions are done.

    In service (not drained/down, responding), minus nodes taken out in this pass,
    plus spares promised to replacements and nodes resumed in this pass. The job's own
    healthy nodes count: requeueing frees them.
    """
    return len(_usable_set(job, snap, planned)[0])


def required_nodes(job: Job) -> list[str]:
    """Nodes the job asked for by name (``-w``); none when Slurm may choose."""
    expr = job.extra.get("required_nodes", "").strip()
    if not expr or expr == "(null)":
        return []
    try:
        return expand_hostlist(expr)
    except SlurmParseError:
        return []  # not ours to judge: let Slurm decide


def _held(name: str, snap: Snapshot, planned: Sequence[PlannedAction]) -> bool:
    """Out for good: held for repair by us (replace, hold), now or in this pass. A node
    being drained, reset or rebooted by us comes back; one a human drained is theirs."""
    if any(a.node == name and a.kind in (Kind.REPLACE, Kind.HOLD) for a in planned):
        return True
    node = snap.nodes.get(name)
    if node is None:
        return True
    ours = parse_reason(node.reason)
    return node.drained and ours is not None and ours.verb in (Verb.REPLACE, Verb.HOLD)


def capacity_shortfall(job: Job, snap: Snapshot, planned: Sequence[PlannedAction]) -> str | None:
    """Why the job could not run if requeued now (the waiting message), or None."""
    held = [n for n in required_nodes(job) if _held(n, snap, planned)]
    if held:
        return (
            f"job {job.job_id} waits for capacity: needs {','.join(held)} "
            "(asked for by name), held for repair"
        )
    inside, _ = _usable_set(job, snap, planned)
    need = max(1, len(job.nodes))
    if len(inside) < need:
        where = ",".join(sorted(job_partitions(job, snap))) or "the cluster"
        return (
            f"job {job.job_id} waits for capacity: needs {need} "
            f"node{'s' if need != 1 else ''} in {where}, {len(inside)} usable"
        )
    return None


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan(
    snap: Snapshot,
    config: ControllerConfig,
    now: float,
    urgent_nodes: set[str],
    faults: Mapping[str, Sequence[FaultRow]],
    planned: Sequence[PlannedAction] = (),
    hung: Mapping[int, str] | None = None,
) -> tuple[list[PlannedAction], list[PlannedEvent]]:
    """Requeues, budget-spent and not-retried notices, and waiting events for this pass.

    ``planned`` are this pass's node actions (for the capacity guard); ``hung`` the
    running jobs past their hang limit, with the cause (``hangs/judge.py``). Waiting events
    repeat every pass while they hold; the service records each message once.
    """
    ar = config.auto_resume
    if not ar.enabled:
        return [], []
    actions: list[PlannedAction] = []
    events: list[PlannedEvent] = []
    busy = {a.job_id for a in snap.in_flight if a.job_id is not None}
    # its step is being retried in place, or will ask to be: no requeue meanwhile
    busy |= left_to_step_retry(snap, now)
    budget_left = ar.max_requeues_per_minute - snap.requeues_last_minute
    capped: list[int] = []
    for job in sorted(snap.jobs, key=lambda j: j.job_id):
        try:
            outcome = _judge(
                job, snap, config, now, urgent_nodes, faults, planned, hung or {}, busy
            )
        except Exception as exc:  # noqa: BLE001 - one odd job never costs the others
            log.exception("auto-resume: job %s skipped this pass", job.job_id)
            what = f"{type(exc).__name__}: {exc}"[:300]
            events.append(
                PlannedEvent(
                    "policy_error",
                    f"auto-resume: job {job.job_id} skipped this pass: {what}",
                    job_id=job.job_id,
                    cause=type(exc).__name__,
                )
            )
            continue
        if outcome is None:
            continue
        if isinstance(outcome, PlannedAction):
            actions.append(outcome)
            continue
        if isinstance(outcome, PlannedEvent):
            events.append(outcome)
            continue
        cause, cap, attempts = outcome
        if budget_left <= 0:
            capped.append(job.job_id)
            continue
        budget_left -= 1
        actions.append(
            PlannedAction(
                Kind.REQUEUE,
                None,
                "",
                cause,
                job_id=job.job_id,
                params={
                    "cap": cap,
                    "attempt": attempts + 1,
                    "restart_count": job.restart_count,
                    "nodes": list(job.nodes),
                },
            )
        )
    if capped:
        events.append(
            PlannedEvent(
                "requeue_capped",
                f"cluster-wide requeue cap ({ar.max_requeues_per_minute}/min) "
                f"reached; waiting: {', '.join(map(str, capped))}",
            )
        )
    return actions, events


def _judge(
    job: Job,
    snap: Snapshot,
    config: ControllerConfig,
    now: float,
    urgent_nodes: set[str],
    faults: Mapping[str, Sequence[FaultRow]],
    planned: Sequence[PlannedAction],
    hung: Mapping[int, str],
    busy: set[int],
) -> PlannedAction | PlannedEvent | tuple[str, int, int] | None:
    """One job's verdict this pass: nothing, a notice, or a requeue (cause, cap, attempts)
    that the cluster-wide requeue budget still has to allow."""
    ar = config.auto_resume
    cap = cap_of(job, snap, ar.default_attempts)
    tracked = snap.tracked.get(job.job_id)
    if cap is None or job.job_id in busy or (tracked and tracked.state == "exhausted"):
        return None
    if (
        tracked
        and tracked.acted_restart_count is not None
        and job.restart_count <= tracked.acted_restart_count
    ):
        return None  # this failure was already requeued; Slurm has not caught up
    code = no_restart(job) if job.state.upper() == "FAILED" else None
    if code is not None:
        if tracked is None or tracked.state != "failed":
            return _not_retried(job, cap, config, code)
        return None
    cause = _cause(job, snap, config, now, urgent_nodes, faults, hung)
    if cause is None:
        if job.state.upper() == "FAILED" and (tracked is None or tracked.state != "failed"):
            return _not_retried(job, cap, config)
        return None
    attempts = tracked.attempts if tracked else 0
    if attempts >= cap:
        return PlannedAction(
            Kind.EXHAUST,
            None,
            "",
            f"{cause}; retry budget spent ({attempts}/{cap}): the job stays {job.state.upper()}",
            job_id=job.job_id,
            params={"cap": cap},
        )
    if tracked and tracked.last_requeue_at is not None and attempts > 0:
        wait = min(ar.backoff_max_s, ar.backoff_base_s * 2 ** (attempts - 1))
        if now < tracked.last_requeue_at + wait:
            return PlannedEvent(
                "requeue_backoff",
                f"job {job.job_id} waits for back-off: requeue attempt "
                f"{attempts + 1}/{cap} not before {_when(tracked.last_requeue_at + wait)}",
                job_id=job.job_id,
                cause=cause,
            )
    short = capacity_shortfall(job, snap, planned)
    if short is not None:
        return PlannedEvent("requeue_waiting", short, job_id=job.job_id, cause=cause)
    return cause, cap, attempts


def _not_retried(
    job: Job, cap: int, config: ControllerConfig, code: int | None = None
) -> PlannedAction:
    """A failure on healthy nodes: said once per failure, and still requeued should a
    fault on its nodes turn up within ``fault_window_s``. With ``code`` (93, 130): the
    application's own stop, never requeued."""
    window = config.auto_resume.fault_window_s
    if code is not None:
        cause = f"job ended with exit {code}: {NO_RESTART_EXITS[code]}; not requeued"
    else:
        cause = (
            f"job failed (exit {job.exit_code}) on healthy nodes "
            f"{','.join(job.nodes) or '-'}; retry_on=node_fault: not requeued (a fault "
            f"found on its nodes within {window:g} s of the failure would still requeue it)"
        )
    return PlannedAction(
        Kind.NOT_RETRIED,
        None,
        "",
        cause,
        job_id=job.job_id,
        params={"cap": cap, "restart_count": job.restart_count},
    )
