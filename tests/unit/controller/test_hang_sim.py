"""A simulated cluster for the hang judgement: its jobs, nodes and agents (the
controller, and the tests of the simulation, are test_hang_controller_sim.py;
test_hang_properties.py drives both).

- **Jobs**: lockstep training (every rank finishes step i at the same true time, as in
  a synchronous data-parallel job), step times jittered (a log-normal factor clipped to
  0.7-1.6), now and then a slow step (1.6-2 x), paused phases (evaluation,
  checkpoints). A healthy job's longest gap is at most 2 x its nominal step while its
  p95 is at least 0.7 x: never idle past 3 x p95, nor past the 5 s floor. A stopped job
  stops stepping at a given time: all ranks silently (deadlock), all in D state, or one
  rank SIGSTOPped and the others blocked in the collective.
- **Nodes**: a multi-node job has its nodes to itself; single-node jobs may share one
  (several small jobs on an 8-GPU node). Node clocks are skewed.
- **Agents as shipped** (agent/daemon.py, agent/reporter.py): one report per cycle,
  sent in full when it differs from the last one sent (progress at most every
  ``progress_report_interval_s``, here equal to the cycle), else a heartbeat naming the
  report just built, every ``progress_report_interval_s`` after the last message (the
  heartbeat cadence while ranks on the node record progress, as they do on every node
  here: ``Reporter._beat_interval``); restarts (a gap, then a new agent id, seq from 1,
  a full report first). Messages arrive after a transit delay, in order.
Ranks in the snapshot are NamedTuples with RankProgress's fields, not pydantic models
(validation is ingest's; 10,000 simulated job-hours of models would not fit the time
budget): ``valid`` checks the first report of every node against the real models.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.agent.reporter import ReporterConfig
from hyperpod_agent.controller.config import ControllerConfig, ProgressConfig
from hyperpod_agent.health import JobProgress

_AGENT = AgentConfig(node_name="sim")
CYCLE_S = _AGENT.effective_cycle_s()
PROGRESS_S = _AGENT.effective_progress_report_interval_s()
HEARTBEAT_S = ReporterConfig().heartbeat_interval_s
BEAT_S = min(HEARTBEAT_S, PROGRESS_S)  # the heartbeat cadence while ranks record progress
PASS_S = ControllerConfig().reconcile_interval_s
PASS_TAKES_S = (0.02, 0.5)  # how long a pass takes (Slurm, the store): passes drift
PROGRESS = ProgressConfig()
RING = 128  # progress/format.py: the step durations a record keeps
WARMUP_S = 60.0  # job start -> first step
LATE_S = 25.0  # the longest a late message is late
T0 = 1_800_000_000.0
Judge = Callable[..., tuple[list[Any], list[Any]]]


@dataclass(frozen=True)
class Spec:
    """One job and what happens around it (seconds)."""

    step_s: float
    jitter: float = 0.1  # sigma of the log-normal step-time factor
    spike: float = 0.01  # chance of a slow step (1.6-2 x)
    nodes: int = 2
    ranks: int = 1  # per node
    hours: float = 1.0
    pauses: int = 0  # paused phases over the run, 30 s to 15 min each
    skew_s: float = 0.0  # node clocks within this of the controller's
    delay_s: float = 0.05  # transit delay up to this
    late: float = 0.0  # chance a message is late by up to LATE_S more
    restarts: int = 0  # agent restarts on its nodes over the run, 2 s to 2 min down
    stop_after_s: float | None = None  # the job stops this long after its start
    stop: str = "deadlock"  # deadlock | dstate | sigstop
    heartbeat_s: float = BEAT_S


class RankView(NamedTuple):
    """RankProgress's fields (see the module doc)."""

    rank: int
    pid: int
    step: int
    step_at: float | None
    paused: bool
    pause_reason: str
    pause_since: float | None
    window: int
    median_s: float | None
    p95_s: float | None
    last_s: float | None
    proc_state: str


class JobView(NamedTuple):
    """JobProgress's fields."""

    job_id: int
    ranks: tuple[RankView, ...]
    uid: int | None = None
    hang_factor: float | None = None
    hang_min_s: float | None = None


def valid(view: JobView) -> JobProgress:
    """``view`` as the real model, which must take it unchanged."""
    real = JobProgress.model_validate(
        {**view._asdict(), "ranks": [r._asdict() for r in view.ranks]}
    )
    assert [r.model_dump() for r in real.ranks] == [r._asdict() for r in view.ranks]
    return real


# -- what really happens ----------------------------------------------------------------
@dataclass
class Truth:
    """One job, in true time (the controller's clock)."""

    job_id: int
    spec: Spec
    start: float
    steps: np.ndarray  # when step i finished
    durations: np.ndarray  # durations[i]: step i's (i >= 1), as the record keeps it
    pause_start: np.ndarray
    pause_end: np.ndarray
    stop_at: float  # inf: never
    limits: dict[int, tuple[float, float]] = field(default_factory=dict)  # n -> median, p95

    @property
    def last_step(self) -> float:
        return float(self.steps[-1])

    def limit_after(self, n: int) -> float:
        """The hang limit the records give once ``n`` steps finished (the rule)."""
        return max(PROGRESS.hang_factor * self.limits[n][1], PROGRESS.hang_min_s)

    def states(self, at: np.ndarray, first_node: bool) -> np.ndarray:
        """Rows (steps finished, pauses begun, pauses ended, stopped?) at times ``at``,
        as a node shows them (``first_node``: the one a SIGSTOP hits)."""
        stopped = (at >= self.stop_at) & (self.spec.stop != "deadlock")
        if self.spec.stop == "sigstop" and not first_node:
            stopped[:] = False
        return np.stack(
            [
                np.searchsorted(self.steps, at, side="right"),
                np.searchsorted(self.pause_start, at, side="right"),
                np.searchsorted(self.pause_end, at, side="right"),
                stopped,
            ],
            axis=1,
        )


def truth(job_id: int, spec: Spec, rng: np.random.Generator, start: float) -> Truth:
    end = start + spec.hours * 3600 + 600
    count = int((end - start) / (0.7 * spec.step_s)) + 2
    factor = np.clip(rng.lognormal(0.0, spec.jitter, count), 0.7, 1.6)
    slow = rng.random(count) < spec.spike
    factor[slow] = rng.uniform(1.6, 2.0, int(slow.sum()))
    durations = spec.step_s * factor
    steps = start + WARMUP_S + np.concatenate(([0.0], np.cumsum(durations[1:])))
    starts, ends = [], []
    # Paused right after distinct steps, each pause shifting the steps after it (the
    # step after one: its duration excludes the pause).
    last = int(np.searchsorted(steps, end - 900))
    if spec.pauses and last > 12:
        for j in np.unique(rng.integers(11, last, spec.pauses)):
            begin = float(steps[j - 1]) + 0.01
            length = float(rng.uniform(30.0, 900.0))
            starts.append(begin)
            ends.append(begin + length)
            steps[j:] += length + 0.01
    stop_at = start + spec.stop_after_s if spec.stop_after_s is not None else np.inf
    steps = steps[steps <= min(stop_at, end)]
    return Truth(
        job_id,
        spec,
        start,
        steps,
        durations[: len(steps)],
        np.array(starts),
        np.array(ends),
        float(stop_at),
    )


def summaries(t: Truth, needed: np.ndarray) -> None:
    """The agent's (median, p95) of the record's ring for each step count needed
    (progress_files.summarise: nearest-rank p95), computed in one go."""
    recorded = t.durations[1:]  # the first step has no duration
    for n in needed[needed <= RING + 1].tolist():
        ring = np.sort(recorded[: max(n - 1, 0)])
        w = len(ring)
        if w:
            median = ring[w // 2] if w % 2 else (ring[w // 2 - 1] + ring[w // 2]) / 2
            t.limits[n] = (float(median), float(ring[(95 * w + 99) // 100 - 1]))
    big = needed[needed > RING + 1]
    if len(big):
        windows = sliding_window_view(recorded, RING)[big - 1 - RING]
        kth = (RING // 2 - 1, RING // 2, (95 * RING + 99) // 100 - 1)
        part = np.partition(windows, kth, axis=1)
        medians = (part[:, kth[0]] + part[:, kth[1]]) / 2
        for n, m, p in zip(big.tolist(), medians.tolist(), part[:, kth[2]].tolist(), strict=True):
            t.limits[n] = (m, p)


# -- the nodes and their agents ---------------------------------------------------------
@dataclass
class Host:
    """A node: the jobs on it ((job, the node's index in the job)) and its agent."""

    name: str
    jobs: list[tuple[Truth, int]]
    skew: float = 0.0
    spans: list[float] = field(default_factory=list)  # [up, down, up, down, ...]
    made: dict[tuple[int, ...], JobView] = field(default_factory=dict)  # Reported's

    @property
    def spec(self) -> Spec:
        return self.jobs[0][0].spec  # delays, heartbeats: its first job's


def place(truths: list[Truth], pack: int, rng: np.random.Generator, end: float) -> list[Host]:
    """Multi-node jobs on nodes of their own; single-node jobs ``pack`` to a node."""
    hosts: list[Host] = []
    shared: list[Truth] = []
    for t in truths:
        if t.spec.nodes == 1 and pack > 1:
            shared.append(t)
        else:
            hosts += [Host(f"j{t.job_id}n{i}", [(t, i)]) for i in range(t.spec.nodes)]
    for k in range(0, len(shared), pack):
        group = shared[k : k + pack]
        hosts.append(Host(f"s{group[0].job_id}", [(t, 0) for t in group]))
    for h in hosts:
        spec = h.spec
        h.skew = float(rng.uniform(-spec.skew_s, spec.skew_s))
        start = min(t.start for t, _ in h.jobs)
        h.spans = [start - float(rng.uniform(0, CYCLE_S)), end]
    for t in truths:  # a job's restarts hit its nodes
        mine = [h for h in hosts if any(u is t for u, _ in h.jobs)]
        for _ in range(t.spec.restarts):
            spans = mine[int(rng.integers(len(mine)))].spans
            down = float(rng.uniform(t.start + WARMUP_S, end))
            gap = float(rng.uniform(2.0, 120.0))
            for k in range(0, len(spans), 2):
                if spans[k] < down and down + gap < spans[k + 1]:
                    spans[k + 1 : k + 1] = [down, down + gap]
                    break
    return hosts


def agent_messages(h: Host, rng: np.random.Generator, end: float) -> tuple[np.ndarray, ...]:
    """(send, heartbeat?, agent epoch, seq, when, rows) of a node's messages, in true
    time; a report's rows: every job's state (Truth.states) when its cycle read them."""
    spec = h.spec
    out: list[list[np.ndarray]] = [[] for _ in range(6)]
    for e in range(0, len(h.spans), 2):
        up, down = h.spans[e], min(h.spans[e + 1], end)
        phase = float(rng.uniform(0, CYCLE_S)) if e else 0.0
        cycles = np.arange(up + phase, down, CYCLE_S)
        if not len(cycles):
            continue
        rows = np.stack([t.states(cycles, i == 0) for t, i in h.jobs], axis=1)
        flat = rows.reshape(len(cycles), -1)
        # In full when it differs from the last one sent: the first, and each change
        # (progress every cycle at most: progress_report_interval_s == the cycle).
        full = np.flatnonzero(np.concatenate(([True], (flat[1:] != flat[:-1]).any(axis=1))))
        full_at = cycles[full]
        gaps = np.floor((np.append(full_at[1:], down) - full_at - 1e-9) / spec.heartbeat_s)
        gaps = gaps.astype(int)
        beat_at = np.repeat(full_at, gaps) + spec.heartbeat_s * (
            np.arange(gaps.sum()) - np.repeat(np.cumsum(gaps) - gaps, gaps) + 1
        )
        beat_seq = np.searchsorted(cycles, beat_at, side="right")  # the pending report's
        send = np.concatenate((full_at, beat_at))
        order = np.argsort(send, kind="stable")
        out[0].append(send[order])
        out[1].append(
            np.concatenate((np.zeros(len(full), bool), np.ones(len(beat_at), bool)))[order]
        )
        out[2].append(np.full(len(send), e // 2))
        out[3].append(np.concatenate((full + 1, beat_seq))[order])
        out[4].append(send[order])
        out[5].append(
            np.concatenate((rows[full], np.zeros((len(beat_at),) + rows.shape[1:], int)))[order]
        )
    if not out[0]:
        return tuple(np.zeros(0) for _ in range(5)) + (np.zeros((0, len(h.jobs), 4), int),)
    return tuple(np.concatenate(x) for x in out)


def report(t: Truth, i: int, state: list[int], skew: float) -> JobView:
    """What the agent of node ``i`` of job ``t`` reports for it in ``state``."""
    spec = t.spec
    n, begun, ended, stopped = state
    paused = begun > ended
    since = t.pause_start[begun - 1] if paused else (t.pause_end[ended - 1] if ended else None)
    median, p95 = t.limits.get(n, (None, None))
    step_at = float(t.steps[n - 1]) + skew if n else None
    last = float(t.durations[n - 1]) if n > 1 else None
    stop = {"dstate": "D", "sigstop": "T"}.get(spec.stop, "S") if stopped else "S"
    return JobView(
        t.job_id,
        tuple(
            RankView(
                i * spec.ranks + r,
                1000 + r,
                n - 1,
                step_at,
                paused,
                "eval" if paused else "",
                float(since) + skew if since is not None else None,
                min(max(n - 1, 0), RING),
                median,
                p95,
                last,
                stop if spec.stop == "dstate" or i == r == 0 else "S",
            )
            for r in range(spec.ranks)
        ),
    )


class Reported(Sequence[JobView]):
    """A report's progress, made when first read: most reports of a job stepping
    faster than the agent's cycle are superseded before any pass reads them, and a
    job's state that did not change since the node's last report is the same view."""

    __slots__ = ("_host", "_rows", "_views")

    def __init__(self, host: Host, rows: list[list[int]]) -> None:
        self._host, self._rows = host, rows
        self._views: tuple[JobView, ...] | None = None

    def views(self) -> tuple[JobView, ...]:
        if self._views is None:
            h = self._host
            made = []
            for k, ((t, i), row) in enumerate(zip(h.jobs, self._rows, strict=True)):
                key = (k, *row)
                view = h.made.get(key)
                if view is None:
                    view = h.made[key] = report(t, i, row, h.skew)
                made.append(view)
            self._views = tuple(made)
        return self._views

    def __getitem__(self, k: Any) -> Any:
        return self.views()[k]

    def __len__(self) -> int:
        return len(self._rows)


class Message(NamedTuple):
    arrival: float  # controller clock
    node: str
    agent: str
    seq: int
    clock: float  # node clock: generated_at, or a heartbeat's sent_at
    progress: Reported | None  # a report's (None: a heartbeat)


def messages(
    hosts: list[Host], truths: list[Truth], rng: np.random.Generator, end: float
) -> list[Message]:
    """Every message of the run, by arrival."""
    out: list[Message] = []
    needed: dict[int, list[np.ndarray]] = {t.job_id: [] for t in truths}
    for h in hosts:
        send, beat, epoch, seq, at, rows = agent_messages(h, rng, end)
        delay = rng.uniform(0, h.spec.delay_s, len(send))
        late = rng.random(len(send)) < h.spec.late
        delay[late] += rng.uniform(0, LATE_S, int(late.sum()))
        arrival = np.maximum.accumulate(send + delay)  # one sender thread: in order
        full = np.flatnonzero(~beat.astype(bool))
        for k, (t, _) in enumerate(h.jobs):
            needed[t.job_id].append(rows[full, k, 0])
        progress: list[Reported | None] = [None] * len(send)
        for x, r in zip(full.tolist(), rows[full].tolist(), strict=True):
            progress[x] = Reported(h, r)
        agents = [f"{h.name}-a{e}" for e in range(int(epoch.max(initial=0)) + 1)]
        out += [
            Message(a, h.name, agents[e], q, c, p)
            for a, e, q, c, p in zip(
                arrival.tolist(),
                epoch.astype(int).tolist(),
                seq.astype(int).tolist(),
                (at + h.skew).tolist(),
                progress,
                strict=True,
            )
        ]
    for t in truths:
        summaries(t, np.unique(np.concatenate(needed[t.job_id] or [np.zeros(0, int)])))
    out.sort(key=_arrival)  # stable: a node's own messages keep their order
    return out


_arrival = operator.itemgetter(0)
