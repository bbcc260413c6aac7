"""Hangs and stragglers from the training ranks' progress (DESIGN §12). Pure.

Each agent reports, per job on its node, every rank's last finished step, when, and a
summary of its recent step times (``JobProgress``). Per running job:

- **Hang**: no rank advanced (a step, or the end of a paused phase) for
  ``max(hang_factor x p95 step time, hang_min_s)``, no rank is in a paused phase, and
  the job has reported at least ``min_steps`` step times (before that there is no
  model of its pace: compilation, warm-up). The p95 is the median of the ranks' p95s,
  so one odd rank does not set the pace. Suspects are the nodes whose ranks are
  stopped, in uninterruptible sleep or gone, whose ranks never reached the step the
  others reached, or which have an open fault. The attribution is *clear* when the
  suspects are some, not all, of the job's nodes.
- **Straggler**: a node whose ranks' median step time exceeds the median of the other
  nodes' by ``straggler_threshold``, over at least ``straggler_min_steps`` steps.

Ranks whose last activity is older than the job's (re)start belong to an earlier run
of a requeued job and are ignored. Each hang (job run, step) and straggler (job run,
node) is declared once: ``snap.findings`` holds the ones already declared. A hang stays
current (and its job's recovery due) until the job advances or runs again.
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

    @property
    def key(self) -> tuple[str, int, int, str, int]:
        return ("hang", self.job_id, self.restart_count, "", self.step)

    def describe(self) -> str:
        who = (
            f"suspect {','.join(self.suspects)} ({self.evidence})"
            if self.suspects
            else "no suspect"
        )
        return (
            f"job {self.job_id} hung: no rank advanced for {self.idle_s:.0f} s past step "
            f"{self.step} (limit {self.threshold_s:.1f} s = max(factor x p95 "
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
    """The job's ranks on its own nodes, from this run of the job: activity at or after
    its start. No allowance for clock skew: a new rank whose clock runs behind is left
    out until its first step, while one allowance wide enough for skew would let the
    records of the run before (a requeued job starting again) be judged as this one's."""
    start = job.start_time.timestamp() if job.start_time is not None else 0.0
    out = []
    for name in job.nodes:
        health = snap.health.get(name)
        if health is None:
            continue
        for jp in health.progress:
            if jp.job_id != job.job_id:
                continue
            for rank in jp.ranks:
                item = _Rank(name, jp, rank)
                if item.activity > 0 and item.activity >= start:
                    out.append(item)
    return out


def _override(ranks: list[_Rank], field: str) -> float | None:
    values = [v for r in ranks if (v := getattr(r.job, field)) is not None]
    return min(values) if values else None


def _suspects(job: Job, ranks: list[_Rank], snap: Snapshot) -> tuple[list[str], str]:
    top = max(r.rank.step for r in ranks)
    why: dict[str, list[str]] = defaultdict(list)
    for r in ranks:
        if r.rank.proc_state in STUCK_STATES:
            why[r.node].append(f"rank {r.rank.rank} state {r.rank.proc_state}")
        elif r.rank.step < top:
            why[r.node].append(f"rank {r.rank.rank} at step {r.rank.step} < {top}")
    for f in snap.open_faults:
        if f.node in job.nodes and Action(f.action).rank >= Action.RESET.rank:
            why[f.node].append(f"open fault {f.component} {f.code}")
    names = sorted(why)
    return names, "; ".join(f"{n}: {', '.join(dict.fromkeys(why[n]))}" for n in names)


def _hang(
    job: Job, ranks: list[_Rank], snap: Snapshot, cfg: ProgressConfig, now: float
) -> Hang | None:
    if any(r.rank.paused for r in ranks):
        return None
    p95s = [r.rank.p95_s for r in ranks if r.rank.p95_s is not None and r.rank.window > 0]
    if max((r.rank.window for r in ranks), default=0) < cfg.min_steps or not p95s:
        return None
    p95 = statistics.median(p95s)
    factor = _override(ranks, "hang_factor") or cfg.hang_factor
    floor = _override(ranks, "hang_min_s") or cfg.hang_min_s
    threshold = max(factor * p95, floor)
    idle = now - max(r.activity for r in ranks)
    if idle <= threshold:
        return None
    suspects, evidence = _suspects(job, ranks, snap)
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
