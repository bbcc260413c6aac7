"""What the controller does about hangs and stragglers (DESIGN §12). Pure.

- A hang or straggler not declared before: a ``finding`` (the event, once).
- A hung auto-resume job: recovered like a node fault (``autoresume.plan`` requeues
  it, with its budget, back-off and the cluster-wide cap). When the hang is clearly
  attributed, the suspect nodes still in service whose evidence the node itself shows
  (a rank's process state as the agent read it, an open fault: ``Hang.shown``) are
  taken out too (``progress.suspect_action``), through the same blast-radius and
  shared-cause limits. A suspect named only by what the job's records say (a rank
  behind the others) is never taken out: a user must not get nodes rebooted by writing
  records. Without a clear attribution the job restarts as it is and the suspects are
  only named in the event.
- A hung job whose ``srun --auto-resume`` step is watched by its step-retry helper:
  the step is told to end (``step_end``, with the hang, ``ending.HangEnd``) and retried
  in place without the suspect node (``stepretry.plan.decide_step``); no requeue and
  no suspect taken out here: the surgery takes it out, or the requeue it falls back to.
- A hung job that is not auto-resume: the event and the metric, and a cancel when
  ``progress.cancel_unmanaged`` says so.
- A straggler: the event (and its count toward the node's lemon score); never an
  action mid-job. With ``progress.straggler_hold_after_job``, once its job no longer
  runs on it, the node is held for inspection (``hyperpod:hold job<J> straggler …``,
  never resumed by us), once: not again after an admin resumed it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from hyperpod_agent.controller.autoresume import cap_of
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.hangs.ending import HangEnd
from hyperpod_agent.controller.hangs.judge import Hang, Straggler
from hyperpod_agent.controller.snapshot import Kind, PlannedAction, Snapshot
from hyperpod_agent.reasons import Owner, Verb, format_reason
from hyperpod_agent.slurm.models import Node

_SUSPECT = {"reboot": (Kind.REBOOT, Verb.REBOOT), "drain": (Kind.DRAIN, Verb.DRAIN)}


def _finding(kind: str, job_id: int, restart: int, cause: str, **extra: object) -> PlannedAction:
    params = {"kind": kind, "job_id": job_id, "restart_count": restart, **extra}
    node = extra.get("node")
    return PlannedAction(
        Kind.FINDING,
        str(node) if node else None,
        "",
        cause,
        job_id=job_id,
        params=params,
    )


def _end_step(hang: Hang, cause: str) -> PlannedAction:
    """Tell the hung job's watched step to end; its retry is judged against the hang."""
    return PlannedAction(
        Kind.STEP_END,
        None,
        "",
        f"hang: {cause}",
        job_id=hang.job_id,
        params={"hang": HangEnd.of(hang).to_json()},
    )


def _suspect_actions(
    hang: Hang,
    config: ControllerConfig,
    nodes: Mapping[str, Node],
    owner: Callable[[Node], Owner],
    busy: set[str],
) -> list[PlannedAction]:
    mode = config.progress.suspect_action
    if not hang.clear or mode not in _SUSPECT:
        return []
    kind, verb = _SUSPECT[mode]
    out = []
    for name in hang.shown:
        node = nodes.get(name)
        # Only a node in service and nobody's: a drained one is out already, and a
        # human's or another tool's node is never touched.
        if node is None or name in busy or node.drained or owner(node) is not Owner.NONE:
            continue
        why = f"job {hang.job_id} hung at step {hang.step}"
        busy.add(name)  # another hang naming it this pass leaves it alone
        out.append(
            PlannedAction(
                kind,
                name,
                format_reason(verb, f"job{hang.job_id}", "hang", why),
                f"hang suspect: {hang.describe()}",
                urgent=True,
                takes_out=True,
            )
        )
    return out


def _hold_stragglers(
    snap: Snapshot,
    config: ControllerConfig,
    owner: Callable[[Node], Owner],
    busy: set[str],
    now: float,
) -> list[PlannedAction]:
    if not config.progress.straggler_hold_after_job:
        return []
    since = now - config.policy.escalation_window_s  # what snap.done covers
    jobs = {j.job_id: j for j in snap.jobs}
    out: list[PlannedAction] = []
    for f in snap.findings:
        if f.kind != "straggler" or f.at < since or any(a.node == f.node for a in out):
            continue
        job = jobs.get(f.job_id)
        if job is not None and job.state.upper() == "RUNNING" and f.node in job.nodes:
            continue  # never mid-job
        node = snap.nodes.get(f.node)
        if node is None or f.node in busy or node.drained or owner(node) is not Owner.NONE:
            continue
        if any(
            a.node == f.node and a.kind in ("hold", "drain") and a.updated_at >= f.at
            for a in snap.done
        ):
            continue  # held once for it already (an admin resumed it since)
        why = f"straggled in job {f.job_id}"
        busy.add(f.node)
        out.append(
            PlannedAction(
                Kind.HOLD,
                f.node,
                format_reason(Verb.HOLD, f"job{f.job_id}", "straggler", why),
                f"straggler held for inspection after job {f.job_id}: {f.detail}",
                takes_out=True,
            )
        )
    return out


def plan(
    snap: Snapshot,
    config: ControllerConfig,
    hangs: list[Hang],
    stragglers: list[Straggler],
    owner: Callable[[Node], Owner],
    busy: Collection[str],
    now: float,
) -> tuple[list[PlannedAction], dict[int, str]]:
    """(this pass's actions, job id -> hang cause for the auto-resume jobs to recover).

    ``busy``: the nodes this pass must not act on: those busy before it, those the
    pass's other rules already act on, and those Slurm is rebooting. The nodes planned
    here join it, so two hangs never take the same node twice."""
    busy = set(busy)
    actions: list[PlannedAction] = []
    hung: dict[int, str] = {}
    jobs = {j.job_id: j for j in snap.jobs}
    # watched, not told to end yet (a told one is not judged: retrying_in_place)
    watched = {j for j, end_at in snap.watched_jobs.items() if end_at is None}
    for hang in hangs:
        cause = hang.describe()
        if not hang.declared:
            actions.append(
                _finding(
                    "hang",
                    hang.job_id,
                    hang.restart_count,
                    cause,
                    step=hang.step,
                    idle_s=round(hang.idle_s, 3),
                )
            )
        job = jobs[hang.job_id]
        if hang.job_id in watched:
            actions.append(_end_step(hang, cause))
        elif cap_of(job, snap, config.auto_resume.default_attempts) is not None:
            hung[hang.job_id] = f"hang: {cause}"
            actions += _suspect_actions(hang, config, snap.nodes, owner, busy)
        elif config.progress.cancel_unmanaged and not hang.declared:
            actions.append(
                PlannedAction(
                    Kind.CANCEL,
                    None,
                    "",
                    f"{cause}; not auto-resume: cancelled (progress.cancel_unmanaged)",
                    job_id=hang.job_id,
                )
            )
    for s in stragglers:
        actions.append(_finding("straggler", s.job_id, s.restart_count, s.describe(), node=s.node))
    actions += _hold_stragglers(snap, config, owner, busy, now)
    return actions, hung
