"""Hangs and stragglers from the training ranks' progress (DESIGN §12). Pure.

Each agent reports, per job on its node, every rank's last finished step, when, and a
summary of its recent step times (``JobProgress``). Per running job:

- **Hang**: no rank advanced (a step, or the end of a paused phase) for
  ``max(hang_factor x p95 step time, hang_min_s)``, no rank is in a paused phase
  younger than ``max_pause_s``, and the job has reported at least ``min_steps`` step
  times (before that there is no model of its pace: compilation, warm-up). The p95 is
  the median of the ranks' p95s, so one odd rank does not set the pace. A job's own
  overrides (from its records) only ever loosen the site's settings: the largest value
  any of its ranks asks for, never below ``[progress]``'s.
- **Suspects** are the nodes whose ranks are stopped, in uninterruptible sleep, zombie
  or gone, whose ranks never reached the step the others reached, or which have an open
  fault. The attribution is *clear* when the suspects are some, not all, of the job's
  nodes. Only what the node itself shows (the process state the agent read, an open
  fault) may take a node out (``Hang.shown``); a step number is what the job's records
  say, written by the job's user, and only names the node.
- **Straggler**: a node whose ranks' median step time exceeds the median of the other
  nodes' by ``straggler_threshold``, over at least ``straggler_min_steps`` steps.

Only records the agent checked against the job's user count (``JobProgress.uid`` equal
to the job's uid in Slurm, where Slurm shows it). Ranks whose last activity is older
than the job's (re)start belong to an earlier run of a requeued job and are ignored.
Each hang (job run, step) and straggler (job run, node) is declared once:
``snap.findings`` holds the ones already declared. A hang stays current (and its job's
recovery due) until the job advances or runs again.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace

from hyperpod_agent.controller.config import ProgressConfig
from hyperpod_agent.controller.snapshot import Snapshot, retrying_in_place
from hyperpod_agent.health import Action, JobProgress, RankProgress
from hyperpod_agent.slurm.models import Job

# Process states that say a rank cannot make progress: stopped, traced, uninterruptible
# (a hung driver or filesystem), zombie, dead, or no such process.
STUCK_STATES = frozenset({"T", "t", "D", "Z", "X", "gone"})


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


@dataclass(frozen=True)
class _Rank:
    node: str
    job: JobProgress
    rank: RankProgress

    @property
    def activity(self) -> float:
        """When the rank last showed progress: a step, or the edge of a paused phase."""
        return max(self.rank.step_at or 0.0, self.rank.pause_since or 0.0)


def _ranks(job: Job, snap: Snapshot) -> list[_Rank]:
    """The job's ranks on its own nodes, checked against its user, from this run of the
    job: activity at or after its start. No allowance for clock skew: a new rank whose
    clock runs behind is left out until its first step, while one allowance wide enough
    for skew would let the records of the run before (a requeued job starting again) be
    judged as this one's."""
    start = job.start_time.timestamp() if job.start_time is not None else 0.0
    out = []
    for name in job.nodes:
        health = snap.health.get(name)
        if health is None:
            continue
        for jp in health.progress:
            if jp.job_id != job.job_id:
                continue
            if job.uid is not None and jp.uid != job.uid:
                continue  # not checked against the job's user, or another user's files
            for rank in jp.ranks:
                item = _Rank(name, jp, rank)
                if item.activity > 0 and item.activity >= start:
                    out.append(item)
    return out


def _setting(ranks: list[_Rank], field: str, site: float) -> float:
    """A hang setting for the whole job: the largest any of its nodes reports for it,
    never below the site's (a job's records may loosen the site's settings, never
    tighten them, and a rank's ask is never overruled by a stricter one elsewhere)."""
    values: list[float] = [v for r in ranks if (v := getattr(r.job, field)) is not None]
    return max([site, *values])


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


def _paused_within(ranks: list[_Rank], cfg: ProgressConfig, now: float) -> tuple[bool, float]:
    """(whether a rank is in a paused phase younger than max_pause_s, the longest pause)."""
    ages = [now - (r.rank.pause_since or r.activity) for r in ranks if r.rank.paused]
    return any(age <= cfg.max_pause_s for age in ages), max(ages, default=0.0)


def _hang(
    job: Job, ranks: list[_Rank], snap: Snapshot, cfg: ProgressConfig, now: float
) -> Hang | None:
    paused, paused_s = _paused_within(ranks, cfg, now)
    if paused:
        return None
    p95s = [r.rank.p95_s for r in ranks if r.rank.p95_s is not None and r.rank.window > 0]
    if max((r.rank.window for r in ranks), default=0) < cfg.min_steps or not p95s:
        return None
    p95 = statistics.median(p95s)
    factor = _setting(ranks, "hang_factor", cfg.hang_factor)
    floor = _setting(ranks, "hang_min_s", cfg.hang_min_s)
    threshold = max(factor * p95, floor)
    idle = now - max(r.activity for r in ranks)
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
        paused_s=paused_s if paused_s > 0 else None,
    )


def _stragglers(job: Job, ranks: list[_Rank], cfg: ProgressConfig) -> Iterator[Straggler]:
    per_node: dict[str, list[float]] = defaultdict(list)
    steps: dict[str, int] = defaultdict(int)
    for r in ranks:
        if r.rank.median_s is not None and r.rank.window >= cfg.straggler_min_steps:
            per_node[r.node].append(r.rank.median_s)
            steps[r.node] = max(steps[r.node], r.rank.window)
    if len(per_node) < 2:
        return
    medians = {n: statistics.median(v) for n, v in per_node.items()}
    for node, mine in sorted(medians.items()):
        others = statistics.median(v for n, v in medians.items() if n != node)
        if others <= 0:
            continue
        ratio = mine / others - 1.0
        if ratio >= cfg.straggler_threshold:
            yield Straggler(job.job_id, job.restart_count, node, ratio, mine, others, steps[node])


def judge(snap: Snapshot, cfg: ProgressConfig, now: float) -> tuple[list[Hang], list[Straggler]]:
    """Current hangs (``declared`` set on those declared before) and stragglers not
    declared before, over the running jobs."""
    if not cfg.enabled:
        return [], []
    declared = {f.key for f in snap.findings}
    hangs: list[Hang] = []
    stragglers: list[Straggler] = []
    retrying = retrying_in_place(snap, now)
    for job in sorted(snap.jobs, key=lambda j: j.job_id):
        if job.state.upper() != "RUNNING" or job.job_id in retrying:
            continue
        ranks = _ranks(job, snap)
        if not ranks:
            continue  # a job that does not report progress is never judged
        hang = _hang(job, ranks, snap, cfg, now)
        if hang is not None:
            hangs.append(replace(hang, declared=hang.key in declared))
        stragglers += [s for s in _stragglers(job, ranks, cfg) if s.key not in declared]
    return hangs, stragglers
