"""A job's goodput, and the cluster's: its window, its incidents painted on its timeline,
then the checkpoint saves and recomputed steps taken out of what is left productive."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from hyperpod_agent.controller.goodput.incidents import (
    RANK,
    Incident,
    recoveries,
    save_pauses,
    step_seconds,
)
from hyperpod_agent.controller.goodput.model import (
    CAUSES,
    PHASE_ENDING_AT,
    POINTS,
    PRODUCTIVE,
    UNACCOUNTED,
    ClusterGoodput,
    IncidentGoodput,
    JobGoodput,
    JobRecord,
    Lost,
    ProgressMark,
    at,
)
from hyperpod_agent.controller.goodput.timeline import Timeline
from hyperpod_agent.controller.store.rows import EventRow
from hyperpod_agent.slurm.models import ENDED_STATES

# The points (by rank) between which each recovery phase runs: a gap in the recorded
# points that overlaps a phase's span holds (part of) that phase's time.
SPAN = {
    "detection": (0, 1),
    "drain": (1, 2),
    "shrink": (2, 3),
    "spare_in": (3, 4),
    "requeue": (2, 4),
    "queue_wait": (4, 5),
    "restart": (5, 7),
}
# What is missing when a phase has no time of its own.
MISSING = {
    "detection": "no fault event on the job's nodes before the controller acted (a node that "
    "died without a report, or a failure only Slurm saw)",
    "drain": "no take-out of the bad node recorded",
    "shrink": "the step retry's shrink is not recorded",
    "spare_in": "the step retry's merge of the spare is not recorded",
    "requeue": "the requeue is not recorded",
    "queue_wait": "the start of the run after the requeue is not recorded (Slurm shows only "
    "the current run's start)",
    "restart": "the first new step is not recorded (no resume marker or progress record "
    "after the restart)",
}


UNTIL_FIRST_STEP = (
    "the first new step is not recorded: the time from the restore to it counts as productive"
)


def _mark_order(m: ProgressMark) -> tuple[object, ...]:
    def num(value: float | None) -> float:
        return float("-inf") if value is None else value

    return (
        m.seen_at, m.rank, m.step, num(m.step_at), m.paused, m.pause_reason,
        num(m.pause_since), num(m.step_s),
    )  # fmt: skip


def job_goodput(
    job: JobRecord,
    events: Sequence[EventRow],
    marks: Sequence[ProgressMark],
    now: float,
    since: float | None = None,
) -> JobGoodput:
    """``job``'s goodput from ``since`` (its start when None) to ``now`` or its end.
    ``events``: the event log (the job's own and the nodes'); ``marks``: progress records
    (only the job's are read)."""
    # One order whatever the store's: records seen at the same instant must not make
    # the answer depend on which came first.
    marks = sorted((m for m in marks if m.job_id == job.job_id), key=_mark_order)
    events = sorted(events, key=lambda e: (e.at, e.id))
    incidents = recoveries(job, events, marks)
    own = [e for e in events if e.job_id == job.job_id]
    limits: list[str] = []
    # The whole life the records show is painted, the window only counted: a recovery
    # or a recomputation that began before ``since`` is placed where it happened.
    begin, end = _span(job, incidents, own, marks, now, limits)
    lo = begin if since is None else min(max(begin, since), end)
    if lo > begin:
        limits = [x for x in limits if not x.startswith(FIRST_START)]
    tl = Timeline(begin, end)
    running = job.state is not None and job.state not in ENDED_STATES
    reports = []
    for i, incident in enumerate(incidents):
        last = i + 1 == len(incidents)
        nxt = end if last else incidents[i + 1].first
        # A step finished after the recovery's last point shows the job at work again.
        stepped = [m.step_at for m in marks if m.step_at and incident.last[1] < m.step_at < nxt]
        seen = min(stepped, default=None)
        ongoing = last and running and seen is None
        reports.append(_paint_incident(tl, incident, min(nxt, seen or nxt), ongoing))
    if job.state == "PENDING":
        after = incidents[-1].last[1] if incidents else begin
        if tl.paint(after, end, UNACCOUNTED):
            limits.append("Slurm shows the job pending: the time since is not counted as work")
    lost = {"checkpoint": _checkpoint(tl, marks, end)}
    lost["recompute"], reach = _recompute(tl, incidents, reports, marks, end)
    totals = tl.totals(lo, end)
    for cause, known in lost.items():  # what of it falls in the window
        if known.seconds is not None:
            lost[cause] = known.model_copy(update={"seconds": totals.get(cause, 0.0)})
    for cause in CAUSES[:7]:
        lost[cause] = _total(cause, totals.get(cause, 0.0), reports)
    wall = end - lo
    productive = totals.get(PRODUCTIVE, 0.0)
    # The incidents whose time (their recomputation included) falls in the window.
    shown = [
        r
        for r, i, until in zip(reports, incidents, reach, strict=True)
        if i.first <= end and (until >= lo or r.ongoing)
    ]
    return JobGoodput(
        job_id=job.job_id,
        state=job.state,
        nodes=weight(job),
        start=at(lo) if wall else None,
        end=at(end) if wall else None,
        wall_s=wall,
        productive_s=productive,
        unaccounted_s=totals.get(UNACCOUNTED, 0.0),
        ettr=productive / wall if wall else None,
        lost={c: lost[c] for c in CAUSES},
        incidents=shown,
        limits=limits,
    )


def weight(job: JobRecord) -> int:
    """The job's nodes: what its time is worth beside other jobs'."""
    return job.node_count or 1


FIRST_START = "the job's first start is not recorded"


def _span(
    job: JobRecord,
    incidents: Sequence[Incident],
    own: Sequence[EventRow],
    marks: Sequence[ProgressMark],
    now: float,
    limits: list[str],
) -> tuple[float, float]:
    """(start, end) of the job's life as the records show it: from its start to its end
    (or ``now``); empty when it never ran as far as they show."""
    records = [t for i in incidents for t in i.points.values()]
    records += [e.at for e in own] + [m.step_at for m in marks if m.step_at]
    first = min((i.first for i in incidents), default=None)
    if job.started_at is not None and (first is None or job.started_at <= first):
        begin = job.started_at
    elif records and (first is not None or job.state != "PENDING"):
        begin = min(records)
        limits.append(
            f"{FIRST_START} (Slurm shows only its current run's start): its wall time "
            "counts from its first record"
        )
    else:
        limits.append("the job has not started as far as the records show")
        return now, now
    if job.state is None:
        end = max(records, default=begin)
        limits.append("Slurm no longer shows the job: its wall time ends at its last record")
    elif job.state in ENDED_STATES:
        end = job.ended_at if job.ended_at is not None else max(records, default=begin)
    else:
        end = now
    begin = min(begin, now)
    return begin, max(begin, min(end, now))


def _paint_incident(
    tl: Timeline, incident: Incident, until: float, ongoing: bool
) -> IncidentGoodput:
    """Paint one recovery: each gap between recorded points with the phase it ends (a
    queue wait from a requeue until Slurm's start), then what follows its last point:
    the phase under way when ``ongoing``, else, when the job is not known to run again,
    unaccounted ``until`` the next record of the job at work (or of a new incident)."""
    phases = applicable(incident)
    painted: dict[str, float] = {}
    absorbed: dict[str, set[str]] = {p: set() for p in phases}
    chain = incident.ordered()
    for (a, ta), (b, tb) in zip(chain, chain[1:], strict=False):
        label = "queue_wait" if a == "requeued" else PHASE_ENDING_AT[b]
        painted[label] = painted.get(label, 0.0) + tl.paint(ta, tb, label)
        for p in phases:
            lo, hi = SPAN[p]
            if p != label and lo < RANK[b] and hi > RANK[a]:
                absorbed[p].add(label)
    name, last = chain[-1]
    if not incident.ended:
        label = _next_phase(incident, name) if ongoing else UNACCOUNTED
        seconds = tl.paint(last, tl.hi if ongoing else until, label)
        if ongoing:
            painted[label] = painted.get(label, 0.0) + seconds
    report: dict[str, Lost] = {}
    for p in phases:
        if absorbed[p]:
            why = f"its start or end is not recorded: counted in {', '.join(sorted(absorbed[p]))}"
            report[p] = Lost(seconds=painted.get(p), complete=False, why=why)
        elif p == "restart" and p in painted and "first_new_step" not in incident.points:
            report[p] = Lost(seconds=painted[p], complete=False, why=UNTIL_FIRST_STEP)
        elif p in painted:
            report[p] = Lost(seconds=painted[p])
        else:
            report[p] = Lost(seconds=None, complete=False, why=_missing(incident, p, ongoing))
    return IncidentGoodput(
        started_at=at(incident.first),
        path=incident.path,
        node=incident.node,
        cause=incident.cause,
        points={p: at(incident.points[p]) if p in incident.points else None for p in POINTS},
        phases=report,
        recomputed_steps=None,
        ongoing=ongoing and not incident.ended,
    )


def applicable(incident: Incident) -> list[str]:
    """The phases this recovery went through, in order."""
    out = ["detection", "drain"]
    requeued = "requeued" in incident.points
    if incident.step_retry and (not requeued or "shrunk" in incident.points):
        out.append("shrink")
    if incident.step_retry and not requeued:
        out.append("spare_in")
    if requeued:
        out += ["requeue", "queue_wait"]
    return [*out, "restart"]


def _next_phase(incident: Incident, point: str) -> str:
    """The phase under way after ``point`` while the recovery goes on."""
    retry = incident.step_retry and "requeued" not in incident.points
    return {
        "fault": "detection",
        "acted": "drain" if retry else "requeue",
        "drained": "shrink" if retry else "requeue",
        "shrunk": "spare_in",
        "requeued": "queue_wait",
    }.get(point, "restart")


def _missing(incident: Incident, phase: str, ongoing: bool) -> str:
    top = max(RANK[p] for p in incident.points)
    if top < SPAN[phase][1] and not incident.ended:
        return "under way" if ongoing else "not reached as far as the records show"
    if phase == "restart" and "first_new_step" not in incident.points:
        return MISSING[phase] + ": counted as productive"
    return MISSING[phase]


def _total(cause: str, seconds: float, reports: Sequence[IncidentGoodput]) -> Lost:
    """A recovery phase over the job's incidents: the painted time, known in full when
    every incident that went through it recorded it."""
    mine = [r.phases[cause] for r in reports if cause in r.phases]
    whys = list(dict.fromkeys(p.why for p in mine if not p.complete and p.why))
    if mine and all(p.seconds is None for p in mine) and not seconds:
        return Lost(seconds=None, complete=False, why="; ".join(whys))
    return Lost(seconds=seconds, complete=not whys, why="; ".join(whys))


def _checkpoint(tl: Timeline, marks: Sequence[ProgressMark], hi: float) -> Lost:
    if not marks:
        return Lost(seconds=None, complete=False, why="no progress records of the job")
    seconds = sum(tl.paint(a, b, "checkpoint") for a, b in save_pauses(marks, hi))
    why = (
        "only the saves its progress records caught under way; the controller keeps each "
        "rank's latest record, so a save between two looks is not seen"
    )
    return Lost(seconds=seconds, complete=False, why=why)


def _recompute(
    tl: Timeline,
    incidents: Sequence[Incident],
    reports: list[IncidentGoodput],
    marks: Sequence[ProgressMark],
    hi: float,
) -> tuple[Lost, list[float]]:
    """Steps run a second time (the highest step before the fault less the step the job
    restored) at the step time the ranks report, out of the productive time after; and
    where each incident's time ends, its recomputation included."""
    recorded = [i.step_s for i in incidents if i.step_s is not None]
    step_s = step_seconds(marks) or (statistics.median(recorded) if recorded else None)
    total, whys = 0.0, []
    reach = [i.last[1] for i in incidents]
    for i, (incident, report) in enumerate(zip(incidents, reports, strict=True)):
        if incident.last_step is None:
            why = (
                "the highest step before the fault is not recorded (the controller keeps "
                "each rank's latest progress record only)"
            )
        elif incident.resumed_step is None:
            why = "the step the job restored is not recorded (no resume marker)"
        elif step_s is None:
            why = "no step duration recorded"
        else:
            steps = max(0, incident.last_step - incident.resumed_step)
            before = incidents[i + 1].first if i + 1 < len(incidents) else hi
            seconds, reach[i] = tl.take(incident.last[1], before, steps * step_s, "recompute")
            reports[i] = report.model_copy(
                update={
                    "recomputed_steps": steps,
                    "phases": {**report.phases, "recompute": Lost(seconds=seconds)},
                }
            )
            total += seconds
            continue
        whys.append(why)
        unknown = Lost(seconds=None, complete=False, why=why)
        reports[i] = report.model_copy(update={"phases": {**report.phases, "recompute": unknown}})
    why = "; ".join(dict.fromkeys(whys))
    if whys and not total:
        return Lost(seconds=None, complete=False, why=why), reach
    return Lost(seconds=total, complete=not whys, why=why), reach


def cluster_goodput(
    jobs: Iterable[JobRecord],
    events: Sequence[EventRow],
    marks: Sequence[ProgressMark],
    now: float,
    since: float | None = None,
) -> ClusterGoodput:
    """Every job's goodput and their sum in node-seconds (a job's seconds times its
    nodes): a 64-node job's hour weighs 64 times a 1-node job's."""
    by_job: dict[int, list[ProgressMark]] = {}
    for m in marks:
        by_job.setdefault(m.job_id, []).append(m)
    counted = [
        g
        for job in sorted(jobs, key=lambda j: j.job_id)
        if (g := job_goodput(job, events, by_job.get(job.job_id, []), now, since)).wall_s > 0
    ]
    wall = sum(g.wall_s * g.nodes for g in counted)
    productive = sum(g.productive_s * g.nodes for g in counted)
    lost = {c: _weighted([(g.lost[c], g.nodes) for g in counted]) for c in CAUSES}
    return ClusterGoodput(
        since=at(since) if since is not None else None,
        until=at(now),
        jobs_counted=len(counted),
        wall_node_s=wall,
        productive_node_s=productive,
        unaccounted_node_s=sum(g.unaccounted_s * g.nodes for g in counted),
        ettr=productive / wall if wall else None,
        lost_node_s=lost,
        jobs=counted,
    )


def _weighted(parts: Sequence[tuple[Lost, int]]) -> Lost:
    known = [(p.seconds, n) for p, n in parts if p.seconds is not None]
    incomplete = sum(1 for p, _ in parts if not p.complete)
    why = f"not known in full for {incomplete} of {len(parts)} jobs" if incomplete else ""
    if parts and not known:
        return Lost(seconds=None, complete=False, why=why)
    return Lost(seconds=sum(s * n for s, n in known), complete=not incomplete, why=why)
