"""A job's recoveries, read from the event log and its progress records: which events
make one incident, and when the incident reached each of its points (model.POINTS).

The events that name the job say what the controller did for it (a step told to end, a
step retry's phases, a requeue, the resume marker read). The fault that started it and
the take-out of the bad node are node events: they belong to the job when their node
is one it held, in the time before the controller acted for it.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hyperpod_agent.controller.goodput.model import JobRecord, ProgressMark, RecoveryPath
from hyperpod_agent.controller.store.rows import EventRow

# A fault or take-out this long before the controller acted for the job did not start
# its recovery (the shared-cause window and a step watch's grace are far shorter).
LOOKBACK_S = 3600.0
# A take-out of a job node counts as the start of the job's recovery only this long before
# the controller acted for the job (it requeues in the pass that takes the node out).
TAKE_OUT_LEAD_S = 60.0

# The job's own events and the point each one marks.
JOB_POINTS = {
    "hang": "fault",
    "step_end": "acted",
    "step_retry_planned": "acted",
    "requeue_waiting": "acted",
    "requeue_backoff": "acted",
    "step_retry_drain": "drained",
    "drain": "drained",
    "reboot": "drained",
    "replace": "drained",
    "hold": "drained",
    "step_retry_shrink": "shrunk",
    "step_retry_absorb": "spare_in",
    "step_retry_done": "spare_in",
    "requeue": "requeued",
    "resumed": "restored",
    # written once the ranks report a step past the one restored (controller/stepmarks.py)
    "first_new_step": "first_new_step",
}
# Of those, the ones a new incident may begin with; the others only carry one further.
TRIGGERS = frozenset(
    {"hang", "step_end", "step_retry_planned", "requeue_waiting", "requeue_backoff", "requeue"}
)
TAKE_OUTS = frozenset({"drain", "reboot", "replace", "hold"})
# Two points of one rank never both happen in one recovery (a step retry rolls back
# before its spare is in, then requeues).
RANK = {
    "fault": 0,
    "acted": 1,
    "drained": 2,
    "shrunk": 3,
    "spare_in": 4,
    "requeued": 4,
    "running_again": 5,
    "restored": 6,
    "first_new_step": 7,
}
# Once one of these is reached the job runs again.
END_POINTS = frozenset({"spare_in", "running_again", "restored", "first_new_step"})
SAVE_PAUSE = "checkpoint save"  # the checkpoint library's pause reason while it blocks

# The words our own events say it in (controller/jobwatch.py, controller/hangs/judge.py).
_RESUMED = re.compile(r"\bresumed from step (\d+)\b")
_REACHED = re.compile(r"\bit had reached step (\d+)\b")
_HUNG = re.compile(r"\bno rank advanced for (\d+) s past step (\d+)\b")


@dataclass
class Incident:
    """One recovery: the points it reached (epoch s) and what is known of it."""

    points: dict[str, float] = field(default_factory=dict)
    node: str | None = None
    cause: str = ""
    step_retry: bool = False  # a step retry in place was asked for
    last_step: int | None = None  # the highest step reached before the fault
    resumed_step: int | None = None  # the checkpoint step the job restored
    step_s: float | None = None  # a step's duration after the restart, as recorded

    @property
    def first(self) -> float:
        return min(self.points.values())

    @property
    def last(self) -> tuple[str, float]:
        """The furthest point reached, and when."""
        name = max(self.points, key=lambda p: (RANK[p], self.points[p]))
        return name, self.points[name]

    @property
    def ended(self) -> bool:
        return any(p in END_POINTS for p in self.points)

    @property
    def path(self) -> RecoveryPath | None:
        if "requeued" in self.points:
            return "requeue"
        return "step_retry" if self.step_retry else None

    def ordered(self) -> list[tuple[str, float]]:
        """The points in the order they happen; a time earlier than the one before (a
        clock step) is taken as that one."""
        out: list[tuple[str, float]] = []
        for name in sorted(self.points, key=lambda p: (RANK[p], self.points[p])):
            when = max(self.points[name], out[-1][1]) if out else self.points[name]
            out.append((name, when))
        return out


def recoveries(
    job: JobRecord, events: Sequence[EventRow], marks: Sequence[ProgressMark]
) -> list[Incident]:
    """The job's incidents, oldest first. ``events``: the job's own and those of any
    node; ``marks``: the job's progress records."""
    own = sorted((e for e in events if e.job_id == job.job_id), key=_order)
    incidents = group(own)
    nodes = job.nodes | {e.node for e in own if e.node}
    others = sorted((e for e in events if e.job_id is None and e.node in nodes), key=_order)
    previous = float("-inf")
    for incident in incidents:
        attach_node_events(incident, others, nodes, previous)
        previous = incident.last[1]
    _slurm_start(incidents, job)
    for i, incident in enumerate(incidents):
        before = incidents[i + 1].first if i + 1 < len(incidents) else float("inf")
        _progress_points(incident, marks, before)
    return incidents


def group(events: Iterable[EventRow]) -> list[Incident]:
    """The job's own events (oldest first) grouped into incidents. A trigger opens a new
    incident unless the current one has not gone past the point it marks (a step told
    to end, then its retry asked for, is one incident; a second requeue is another)."""
    out: list[Incident] = []
    for ev in events:
        point = JOB_POINTS.get(ev.kind)
        if point is None:
            continue
        current = out[-1] if out else None
        if ev.kind in TRIGGERS and (current is None or _opens(current, point)):
            current = Incident()
            out.append(current)
        when = _first_step_at(current, ev) if ev.kind == "first_new_step" else ev.at
        if current is None or when is None or _too_late(current, point, when):
            continue
        fresh = point not in current.points
        current.points.setdefault(point, when)
        current.step_retry |= ev.kind.startswith("step_retry") or ev.kind == "step_end"
        if ev.node and current.node is None and ev.kind != "hang":
            current.node = ev.node
        if not current.cause and ev.cause and ev.kind in TRIGGERS:
            current.cause = ev.cause
        if fresh:
            _read_message(current, ev)
    return out


def _opens(current: Incident, point: str) -> bool:
    highest = max(RANK[p] for p in current.points)
    return RANK[point] <= highest and not (point == "acted" and highest == RANK["acted"])


def _too_late(current: Incident, point: str, when: float) -> bool:
    """Once the job runs again, a further point belongs to this recovery only soon
    after (a restart hours later is not this recovery's)."""
    if not current.ended:
        return False
    name, last = current.last
    return RANK[point] > RANK[name] and when - last > LOOKBACK_S


def _first_step_at(incident: Incident | None, ev: EventRow) -> float | None:
    """When a ``first_new_step`` event says the step finished (its cause, JSON), or None
    when it is not readable or not the step after the one ``incident`` restored."""
    try:
        doc = json.loads(ev.cause)
        at, step = float(doc["at"]), int(doc["step"])
        step_s = float(doc["step_s"]) if "step_s" in doc else None
    except (ValueError, TypeError, KeyError):
        return None
    if incident is None or not math.isfinite(at) or at > ev.at:
        return None
    if incident.resumed_step is not None and step != incident.resumed_step + 1:
        return None
    if step_s is not None and math.isfinite(step_s) and step_s > 0:
        incident.step_s = step_s
    return at


def _read_message(incident: Incident, ev: EventRow) -> None:
    if ev.kind == "resumed" and (m := _RESUMED.search(ev.message)):
        incident.resumed_step = int(m.group(1))
        if reached := _REACHED.search(ev.message):
            # The highest step before the restart, seen while the job ran: its progress
            # records are gone once it ended.
            incident.last_step = max(int(reached.group(1)), incident.last_step or 0)
    elif ev.kind == "hang" and (m := _HUNG.search(ev.message)):
        # The hang began when the last step finished: its declaration less the idle time.
        incident.points["fault"] = ev.at - int(m.group(1))
        incident.last_step = int(m.group(2))
        incident.cause = incident.cause or f"hang past step {m.group(2)}"


def attach_node_events(
    incident: Incident, events: Sequence[EventRow], nodes: frozenset[str], after: float
) -> None:
    """The take-out of the bad node and the fault that started ``incident``, from the node
    events after ``after`` (the previous incident's last point). With the bad node named
    (a step retry, a take-out) only its events count, else those of every job node."""
    first = incident.first
    named = {incident.node} if incident.node else set(nodes)
    # A take-out counts only just before the controller acted for the job: a node drained
    # for a fault that spared the job (a drain lets its jobs run on) did not stop it.
    out = [
        e
        for e in events
        if e.kind in TAKE_OUTS and e.node in named and max(after, first - TAKE_OUT_LEAD_S) < e.at
        if e.at <= first
    ]
    if out and out[0].at < incident.points.get("drained", float("inf")):
        incident.points["drained"] = out[0].at
        incident.node = incident.node or out[0].node
    if times := _action_times(incident):
        incident.points["acted"] = min(times)
    if "fault" not in incident.points:
        fault = _fault(incident, events, {incident.node} if incident.node else set(nodes), after)
        if fault is not None:
            incident.points["fault"] = fault.at
            incident.node = incident.node or fault.node
            incident.cause = fault.cause or incident.cause


def _action_times(incident: Incident) -> list[float]:
    return [
        incident.points[p]
        for p in ("acted", "drained", "shrunk", "spare_in", "requeued")
        if p in incident.points
    ]


def _fault(
    incident: Incident, events: Sequence[EventRow], nodes: set[str], after: float
) -> EventRow | None:
    """The latest fault still open when the controller acted. The latest, not the
    earliest: a mild fault open for long beside it did not start the recovery."""
    acted = incident.points.get("acted", incident.first)
    cleared = [(e.node, e.cause, e.at) for e in events if e.kind == "fault_cleared"]
    found = None
    for ev in events:
        if ev.kind != "fault" or ev.node not in nodes:
            continue
        if not (after < ev.at <= acted and ev.at >= acted - LOOKBACK_S):
            continue
        if any(n == ev.node and c == ev.cause and ev.at < t <= acted for n, c, t in cleared):
            continue
        found = ev
    return found


def _slurm_start(incidents: Sequence[Incident], job: JobRecord) -> None:
    """Slurm's start of the current run ends the queue wait of the last requeue."""
    start = job.started_at
    if start is None:
        return
    requeued = [i for i in incidents if "requeued" in i.points]
    if not requeued:
        return
    last = requeued[-1]
    later = [i.first for i in incidents if i.first > last.points["requeued"]]
    if last.points["requeued"] <= start and (not later or start <= min(later)):
        last.points["running_again"] = start


def _progress_points(incident: Incident, marks: Sequence[ProgressMark], before: float) -> None:
    """From the progress records: the highest step before the fault, and the first new
    step (the one after the step restored) before the next incident."""
    start = incident.points.get("fault", incident.first)
    reached = [m.step for m in marks if m.step_at is not None and m.step_at <= start]
    if incident.last_step is None and reached:
        incident.last_step = max(reached)
    if incident.resumed_step is None or "first_new_step" in incident.points:
        return
    # After the job was given its nodes back; the resume marker is read a pass late.
    back = max(t for p, t in incident.points.items() if p != "restored")
    firsts = [
        m.step_at
        for m in marks
        if m.step == incident.resumed_step + 1 and m.step_at is not None
        if back <= m.step_at < before
    ]
    if firsts:
        incident.points["first_new_step"] = min(firsts)


def step_seconds(marks: Sequence[ProgressMark]) -> float | None:
    """A step's duration as the ranks measured it lately (the median), or None."""
    values = [m.step_s for m in marks if m.step_s is not None and m.step_s > 0]
    return statistics.median(values) if values else None


def save_pauses(marks: Sequence[ProgressMark], end: float) -> list[tuple[float, float]]:
    """The checkpoint saves the records caught under way, as (start, end): a rank seen
    paused in a save, then seen again out of it (its pause ended then), or still in it
    (until ``end``). A save begun and ended between two looks is not seen."""
    by_rank: dict[int, list[ProgressMark]] = {}
    for m in sorted(marks, key=lambda m: m.seen_at):
        by_rank.setdefault(m.rank, []).append(m)
    out: list[tuple[float, float]] = []
    for seen in by_rank.values():
        for i, m in enumerate(seen):
            if not (m.paused and m.pause_reason.startswith(SAVE_PAUSE) and m.pause_since):
                continue
            nxt = seen[i + 1] if i + 1 < len(seen) else None
            if nxt is None:
                out.append((m.pause_since, max(m.pause_since, end)))
            elif nxt.pause_since == m.pause_since and nxt.paused:
                continue  # the same pause, seen again: the next look says more
            elif not nxt.paused and nxt.pause_since and nxt.pause_since >= m.pause_since:
                out.append((m.pause_since, nxt.pause_since))
    return out


def _order(e: EventRow) -> tuple[float, int]:
    return (e.at, e.id)
