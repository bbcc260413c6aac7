"""Hangs and stragglers from the training ranks' progress (DESIGN §12). Pure, but for
the memory the controller passes it (``HangMemory``: evidence from heartbeats, and the
judgement of the pass before).

Each agent reports, per job on its node, every rank's last finished step, when, and a
summary of its recent step times (``JobProgress``). Per running job:

- **What is known, and until when.** A node's progress is as of its report's
  ``generated_at``, extended by the heartbeats of the same agent that say nothing changed
  since (memory.py): both times are the node's clock, the clock the ranks wrote their
  step times with. A node not heard from (report or such heartbeat) for ``STALE_S`` is
  *unknown*; a job with a rank on an unknown node is not judged this pass. Unknown is
  never idle: an agent restarting, a partition, a report late in transit never make a
  hang, they only delay one.
- **Idle** is measured on each node's own clock: how long before the time its progress
  is known current its ranks last advanced (a step, or the end of a paused phase); the
  job's idle time is the shortest of its nodes'. The controller's clock, the delay of a
  report and the agents' cadence never add to it: it only grows with evidence.
- **Hang**: idle past ``max(hang_factor x p95 step time, hang_min_s)``, no rank in a
  paused phase younger than ``max_pause_s`` (on its node's clock), and the job has
  reported at least ``min_steps`` step times (before that there is no model of its
  pace: compilation, warm-up). The p95 is the median of the ranks' p95s, so one odd
  rank does not set the pace. A job's own overrides (from its records) only ever loosen
  the site's settings: the largest value any of its ranks asks for, never below
  ``[progress]``'s. With a memory, a hang counts only when the pass before judged the
  job hung at the same step too (two consecutive judgements).
- **Suspects** are the nodes whose ranks are stopped, in uninterruptible sleep, zombie
  or gone, whose ranks never reached the step the others reached, or which have an open
  fault. The attribution is *clear* when the suspects are some, not all, of the job's
  nodes. Only what the node itself shows (the process state the agent read, an open
  fault) may take a node out (``Hang.shown``); a step number is what the job's records
  say, written by the job's user, and only names the node.
- **Straggler**: a node whose ranks' median step time exceeds the median of the other
  nodes' by ``straggler_threshold``, over at least ``straggler_min_steps`` steps. A rank
  that records its compute time reports the median of that instead (the agent's
  summary, ``RankProgress.median_s``): in a synchronous job every rank's step lasts as
  long as the slowest's, and only compute time tells the slow one.

Only records the agent checked against the job's user count (``JobProgress.uid`` equal
to the job's uid in Slurm, where Slurm shows it). Ranks whose last activity is older
than the job's (re)start belong to an earlier run of a requeued job and are ignored.
Each hang (job run, step) and straggler (job run, node) is declared once:
``snap.findings`` holds the ones already declared. A hang stays current (and its job's
recovery due) until the job advances or runs again.
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

from hyperpod_agent.controller.config import ProgressConfig
from hyperpod_agent.controller.hangs.memory import HangMemory, median
from hyperpod_agent.controller.snapshot import NodeHealth, Snapshot, retrying_in_place, speaks_for
from hyperpod_agent.health import Action, JobProgress, RankProgress
from hyperpod_agent.slurm.models import Job

# Process states that say a rank cannot make progress: stopped, traced, uninterruptible
# (a hung driver or filesystem), zombie, dead, or no such process.
STUCK_STATES = frozenset({"T", "t", "D", "Z", "X", "gone"})
# A node not heard from for this long is unknown. A live agent with nothing new says so
# every heartbeat_interval_s (30 s shipped): two of them, so one lost or late heartbeat
# does not blind the judgement of a hung job (whose agent sends nothing else), and still
# short of heartbeat_timeout_s (90 s), when the controller takes the agent for lost.
# Being unknown never makes a hang; this bound keeps old claims (a process state, a
# step behind) from naming a node long after its agent last spoke.
STALE_S = 60.0


@dataclass(frozen=True)
class Hang:
    job_id: int
    restart_count: int
    step: int  # the furthest step any rank finished
    idle_s: float
    threshold_s: float
    p95_s: float
    suspects: tuple[str, ...]
    evidence: str  # why each suspect is one ("" when none)
    clear: bool  # suspects are some, not all, of the job's nodes
    declared: bool = False  # declared in an earlier pass (the event is out already)
    # The suspects whose evidence the node shows (process state, open fault): the only
    # ones an action may take out.
    shown: tuple[str, ...] = ()
    paused_s: float | None = None  # a paused phase this long, past max_pause_s

    @property
    def key(self) -> tuple[str, int, int, str, int]:
        return ("hang", self.job_id, self.restart_count, "", self.step)

    def describe(self) -> str:
        who = (
            f"suspect {','.join(self.suspects)} ({self.evidence})"
            if self.suspects
            else "no suspect"
        )
        paused = (
            f", paused for {self.paused_s:.0f} s (over max_pause_s)"
            if self.paused_s is not None
            else ""
        )
        return (
            f"job {self.job_id} hung: no rank advanced for {self.idle_s:.0f} s past step "
            f"{self.step}{paused} (limit {self.threshold_s:.1f} s = max(factor x p95 "
            f"{self.p95_s:.3f} s, floor)); {who}"
        )


@dataclass(frozen=True)
class Straggler:
    job_id: int
    restart_count: int
    node: str
    ratio: float  # how much slower than the other nodes' median (0.4 = 40 %)
    node_median_s: float
    others_median_s: float
    steps: int

    @property
    def key(self) -> tuple[str, int, int, str, int]:
        return ("straggler", self.job_id, self.restart_count, self.node, -1)

    def describe(self) -> str:
        return (
            f"{self.node} straggles in job {self.job_id}: median step "
            f"{self.node_median_s:.3f} s vs {self.others_median_s:.3f} s on the other "
            f"nodes (+{self.ratio:.0%}) over {self.steps} steps"
        )


class _Rank(NamedTuple):  # one per rank per pass: the cheapest record to make
    node: str
    job: JobProgress
    rank: RankProgress
    activity: float  # when it last showed progress: a step, or the edge of a pause
    seen: float  # node clock: its record is known current up to here


def _known(name: str, health: NodeHealth, memory: HangMemory | None, now: float) -> float | None:
    """Until when (node clock) the node's stored progress is known current; None if
    the node is unknown (not heard from for ``STALE_S``)."""
    if health.generated_at is None:
        return None
    evidence = memory.evidence(name, health.generated_at) if memory else None
    if evidence is not None:
        until: float = evidence.until
        heard: float | None = evidence.heard
    else:  # no memory of this report: its own time, and the last word from the node
        until, heard = health.generated_at, health.last_seen
    if heard is None or now - heard > STALE_S:
        return None
    return until


# What each node reports of a job: job id -> [(node, its health, the job's progress)].
_Reported = dict[int, list[tuple[str, NodeHealth, JobProgress]]]


def _reported(snap: Snapshot) -> _Reported:
    """Every job's progress by job, gathered once a pass (a node may run many jobs)."""
    out: _Reported = defaultdict(list)
    for name, health in snap.health.items():
        for jp in health.progress:
            out[jp.job_id].append((name, health, jp))
    return out


def _ranks(
    job: Job, reported: _Reported, memory: HangMemory | None, now: float, launched: float = 0.0
) -> tuple[list[_Rank], float] | None:
    """The job's ranks on its own nodes, checked against its user, from this run of the
    job (activity at or after its start), and how long none of them advanced. None
    when one of them is on an unknown node: unknown is never idle, never hung.

    Idle is measured per node on its own clock (its progress known current until
    ``seen``, its ranks' last activity), the shortest over the nodes: never on the
    controller's clock, so a late or missing report makes it shorter, not longer.
    No allowance for clock skew in what counts as this run's: a new rank whose clock
    runs behind is left out until its first step, while one allowance wide enough for
    skew would let the records of the run before (a requeued job starting again) be
    judged as this one's."""
    start = job.start_time.timestamp() if job.start_time is not None else 0.0
    # A step retried in place starts again in the same job: what its ranks recorded
    # before the launch under watch began is the launch before's (a hung one).
    start = max(start, launched)
    out: list[_Rank] = []
    idle = math.inf
    known: dict[str, float] = {}  # node -> until when its progress is known current
    for name, health, jp in reported.get(job.job_id, ()):
        if not speaks_for(job, name, jp):
            continue  # another node's, another user's or unchecked records
        latest = 0.0
        for rank in jp.ranks:
            activity = max(rank.step_at or 0.0, rank.pause_since or 0.0)
            if activity <= 0 or activity < start:
                continue
            seen = known.get(name)
            if seen is None:
                seen = _known(name, health, memory, now)
                if seen is None:
                    return None
                known[name] = seen
            latest = max(latest, activity)
            out.append(_Rank(name, jp, rank, activity, seen))
        if latest:
            idle = min(idle, known[name] - latest)
    return out, idle


def _suspects(
    job: Job, ranks: list[_Rank], snap: Snapshot
) -> tuple[list[str], str, tuple[str, ...]]:
    """(suspect nodes, why each, those of them whose evidence the node shows)."""
    top = max(r.rank.step for r in ranks)
    why: dict[str, list[str]] = defaultdict(list)
    shown: set[str] = set()
    for r in ranks:
        if r.rank.proc_state in STUCK_STATES:
            why[r.node].append(f"rank {r.rank.rank} state {r.rank.proc_state}")
            shown.add(r.node)
        elif r.rank.step < top:
            why[r.node].append(f"rank {r.rank.rank} at step {r.rank.step} < {top}")
    for f in snap.open_faults:
        if f.node in job.nodes and Action(f.action).rank >= Action.RESET.rank:
            why[f.node].append(f"open fault {f.component} {f.code}")
            shown.add(f.node)
    names = sorted(why)
    evidence = "; ".join(f"{n}: {', '.join(dict.fromkeys(why[n]))}" for n in names)
    return names, evidence, tuple(sorted(shown))


def _hang(
    job: Job, ranks: list[_Rank], idle: float, snap: Snapshot, cfg: ProgressConfig
) -> Hang | None:
    if idle <= cfg.hang_min_s:
        return None  # within the floor of any limit (overrides only loosen it)
    # The job's settings: the largest any of its ranks' records asks for, never below
    # the site's (a job may loosen the site's settings, never tighten them, and a
    # rank's ask is never overruled by a stricter one elsewhere).
    factor, floor = cfg.hang_factor, cfg.hang_min_s
    p95s: list[float] = []
    window = 0
    paused: list[float] = []  # how long each paused rank has been, on its own clock
    for r in ranks:
        rank, jp = r.rank, r.job
        if rank.paused:
            paused.append(r.seen - (rank.pause_since or r.activity))
        if rank.p95_s is not None and rank.window > 0:
            p95s.append(rank.p95_s)
        window = max(window, rank.window)
        if jp.hang_factor is not None and jp.hang_factor > factor:
            factor = jp.hang_factor
        if jp.hang_min_s is not None and jp.hang_min_s > floor:
            floor = jp.hang_min_s
    if any(age <= cfg.max_pause_s for age in paused):
        return None  # a phase without steps is not a hang, up to max_pause_s
    if window < cfg.min_steps or not p95s:
        return None  # no model of its pace yet
    p95 = median(p95s)
    threshold = max(factor * p95, floor)
    if idle <= threshold:
        return None
    suspects, evidence, shown = _suspects(job, ranks, snap)
    with_ranks = {r.node for r in ranks}
    clear = bool(suspects) and not with_ranks <= set(suspects)
    return Hang(
        job.job_id,
        job.restart_count,
        max(r.rank.step for r in ranks),
        idle,
        threshold,
        p95,
        tuple(suspects),
        evidence,
        clear,
        shown=shown,
        paused_s=max(paused) if paused and max(paused) > 0 else None,
    )


def _stragglers(job: Job, ranks: list[_Rank], cfg: ProgressConfig) -> Iterator[Straggler]:
    # Every pass, every job: most have no rank that much slower than the fastest one,
    # hence no node that much slower than the others' median (node medians lie between
    # the ranks' extremes). One loop tells, before any per-node work.
    times = [
        r.rank.median_s
        for r in ranks
        if r.rank.median_s is not None and r.rank.window >= cfg.straggler_min_steps
    ]
    if len(times) < 2 or max(times) < (1.0 + cfg.straggler_threshold) * min(times):
        return
    per_node: dict[str, list[float]] = {}
    steps: dict[str, int] = {}
    for r in ranks:
        if r.rank.median_s is not None and r.rank.window >= cfg.straggler_min_steps:
            per_node.setdefault(r.node, []).append(r.rank.median_s)
            steps[r.node] = max(steps.get(r.node, 0), r.rank.window)
    if len(per_node) < 2:
        return  # nobody to compare a node with
    medians = {n: median(v) for n, v in per_node.items()}
    for node, mine in sorted(medians.items()):
        others = median(v for n, v in medians.items() if n != node)
        if others <= 0:
            continue
        ratio = mine / others - 1.0
        if ratio >= cfg.straggler_threshold:
            yield Straggler(job.job_id, job.restart_count, node, ratio, mine, others, steps[node])


_job_id = operator.attrgetter("job_id")


def judge(
    snap: Snapshot, cfg: ProgressConfig, now: float, memory: HangMemory | None = None
) -> tuple[list[Hang], list[Straggler]]:
    """Current hangs (``declared`` set on those declared before) and stragglers not
    declared before, over the running jobs.

    With ``memory`` (the controller's, fed by ingest): heartbeats extend what the
    reports show, and a hang is returned only once two consecutive calls (passes) judged
    it; call it once per pass. Without: one judgement on the reports alone."""
    if not cfg.enabled:
        return [], []
    declared = {f.key for f in snap.findings}
    hangs: list[Hang] = []
    stragglers: list[Straggler] = []
    nodes: dict[int, tuple[str, ...]] = {}
    retrying = retrying_in_place(snap, now)
    reported = _reported(snap)
    for job in sorted(snap.jobs, key=_job_id):
        if job.state.upper() != "RUNNING" or job.job_id in retrying:
            continue
        found = _ranks(job, reported, memory, now, snap.watch_launched.get(job.job_id, 0.0))
        if not found or not found[0]:
            continue  # unknown, or a job that does not report progress: not judged
        ranks, idle = found
        hang = _hang(job, ranks, idle, snap, cfg)
        if hang is not None:
            hangs.append(replace(hang, declared=hang.key in declared))
            nodes[job.job_id] = job.nodes
        stragglers += [s for s in _stragglers(job, ranks, cfg) if s.key not in declared]
    if memory is not None:
        hangs = memory.confirm(hangs, nodes)
    return hangs, stragglers
