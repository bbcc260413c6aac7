"""What the hang judgement remembers between passes: in memory, bounded, fed by ingest.

Two things the stored snapshot cannot say:

- **Until when a node's progress is known to be current.** An agent sends its full
  report when something in it changed, one whose only change is progress at most every
  ``progress_report_interval_s`` (one cycle, 5 s, shipped). When nothing changed it
  sends only a heartbeat naming the sequence number of its latest report, every
  ``heartbeat_interval_s`` (at the progress cadence while ranks on the node record
  progress): for a hung job those heartbeats are the only news. The agent sends a
  heartbeat only when its latest report equals the last full one, progress included
  (a change of progress goes out in full once ``progress_report_interval_s`` passed,
  never later than the heartbeat would at the shipped settings). So a heartbeat from
  the agent that sent the stored report, naming report ``s`` at or after the stored
  one's sequence number, says the stored progress was still current when the agent
  built report ``s``, on the node's own clock. The agent builds one report per cycle
  and numbers them in order, so report ``s`` was built ``s - seq`` cycles after the
  stored one: once two reports of the agent showed its cycle, the heartbeat is dated
  by that, never later than the heartbeat's own ``sent_at`` (a cycle is never shorter
  than configured, but a report may be built late in its cycle). Before (the agent,
  or this controller, just started), by ``sent_at`` less one cycle, the cycle as the
  stored report and the heartbeat show it: the report named may be that old. A
  heartbeat naming the stored report itself attests nothing past it (the agent's own
  loop may be stuck). Silence says nothing: from here a restarting agent and a hung
  job look the same.
- **Which jobs the last pass judged hung.** A hang is declared only when two
  consecutive passes judge the job hung at the same step of the same run; a pass that
  does not (the job advanced, a node went unknown, the job ended) forgets the job.

It also tells ingest when news should run the pass at once rather than at the next
tick: news from a node of a job judged hung once (its second judgement is due), and a
heartbeat that takes a job on the node past its hang limit (its first).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar

from hyperpod_agent.controller.config import ProgressConfig
from hyperpod_agent.health import JobProgress

# The agent cycle assumed until two reports of an agent show its own: the longest an
# agent may be configured with (AgentConfig.cycle_s <= 60), so a heartbeat attests less,
# never more, than it can.
MAX_CYCLE_S = 60.0
MIN_CYCLE_S = 0.2  # AgentConfig's shortest effective cycle
# Bounds: one entry per node that reported, one per job judged hung in the last pass.
MAX_NODES = 65_536
MAX_PENDING = 65_536


class Evidence(NamedTuple):
    """A node's stored report as the judgement may use it."""

    until: float  # node clock: its progress was still current then
    heard: float  # controller clock: when that was last confirmed


class _Node(NamedTuple):  # made on every report: the cheapest record to make
    agent_id: str
    seq: int  # the stored report's
    generated_at: float  # the stored report's, node clock
    cycle_s: float  # the agent's cycle, as its reports show it
    measured: bool  # cycle_s is from two reports of this agent (else a guess, or the max)
    until: float  # node clock: the stored progress is known current up to here
    heard: float  # controller clock: when the latest evidence of it arrived
    progress: Sequence[JobProgress]  # the stored report's
    due: float | None  # node clock: when a job here passes its limit (None: not computed)


class _Judged(Protocol):
    """What confirm needs of a hang (judge.Hang; judge imports this module)."""

    @property
    def job_id(self) -> int: ...

    @property
    def key(self) -> tuple[str, int, int, str, int]: ...


H = TypeVar("H", bound=_Judged)


@dataclass(frozen=True)
class _Pending:
    key: tuple[str, int, int, str, int]  # the hang's (job run, step)
    nodes: frozenset[str]
    confirmed: bool


def median(values: Iterable[float]) -> float:
    """The median of non-empty values (statistics.median, without its overhead:
    this runs for every job of every report)."""
    s = sorted(values)
    half = len(s) // 2
    return s[half] if len(s) % 2 else (s[half - 1] + s[half]) / 2


def _due(progress: Sequence[JobProgress], cfg: ProgressConfig) -> float:
    """When (node clock) the first job of ``progress`` passes its hang limit as this
    node's records and the site settings give it, if nothing moves; inf: none will
    (paused, or no pace yet). Only a hint for waking the loop: the judge decides."""
    due = math.inf
    for jp in progress:
        p95s = []
        latest = 0.0
        for r in jp.ranks:
            if r.paused:
                break
            if r.p95_s is not None and r.window >= cfg.min_steps:
                p95s.append(r.p95_s)
            latest = max(latest, r.step_at or 0.0, r.pause_since or 0.0)
        else:
            if p95s and latest > 0:
                factor = max(cfg.hang_factor, jp.hang_factor or 0.0)
                floor = max(cfg.hang_min_s, jp.hang_min_s or 0.0)
                due = min(due, latest + max(factor * median(p95s), floor))
    return due


def _attested(last: _Node, seq: int, sent_at: float, cycle: float) -> float:
    """Until when (node clock) a heartbeat naming report ``seq`` of the agent that
    sent ``last`` says ``last``'s progress held: when that agent built report ``seq``.

    Dated by the report it names when two reports showed the agent's cycle: one report
    per cycle, so ``seq - last.seq`` cycles after ``last``. Never after ``sent_at``:
    the report was built before the heartbeat naming it went out, and a cycle taken
    from two reports may be long (one of them built late in its cycle), which would
    date it later than it was. Otherwise ``sent_at`` less one cycle (``cycle``, as the
    report and this heartbeat show it): the report named may be that old."""
    if seq == last.seq:
        return last.generated_at  # the stored report itself: nothing newer is known
    if last.measured:
        return min(last.generated_at + (seq - last.seq) * last.cycle_s, sent_at)
    return sent_at - cycle


class HangMemory:
    """Per-node evidence (fed by ingest) and per-job judgements (fed by the judge).

    Written from the controller's API threads and its loop: one lock."""

    def __init__(self, cfg: ProgressConfig | None = None) -> None:
        self.cfg = cfg or ProgressConfig()
        self._lock = threading.Lock()
        self._nodes: OrderedDict[str, _Node] = OrderedDict()
        self._pending: dict[int, _Pending] = {}
        # The jobs awaiting their second judgement, and their nodes (a heartbeat names
        # no job): news from those runs the pass at once.
        self._suspects: frozenset[int] = frozenset()
        self._waking: frozenset[str] = frozenset()

    # -- evidence, from ingest ----------------------------------------------------------
    def report(
        self,
        node: str,
        agent_id: str,
        seq: int,
        generated_at: float,
        received_at: float,
        progress: Sequence[JobProgress] = (),
    ) -> bool:
        """A full report from ``node`` was stored. Returns whether to pass now: it is
        news of a job awaiting its second judgement."""
        with self._lock:
            last = self._nodes.get(node)
            cycle = MAX_CYCLE_S
            measured = last is not None and last.agent_id == agent_id and seq > last.seq
            if last is not None and measured:
                # One report per agent cycle: the reports show the cycle. One built late
                # in its cycle makes this long: _attested never dates a heartbeat past
                # its own sending for that.
                span = (generated_at - last.generated_at) / (seq - last.seq)
                cycle = min(max(span, MIN_CYCLE_S), MAX_CYCLE_S)
            self._nodes[node] = _Node(
                agent_id,
                seq,
                generated_at,
                cycle,
                measured,
                generated_at,
                received_at,
                progress,
                None,
            )
            self._nodes.move_to_end(node)
            if len(self._nodes) > MAX_NODES:
                self._nodes.popitem(last=False)
            return node in self._waking or (
                bool(self._suspects) and any(jp.job_id in self._suspects for jp in progress)
            )

    def heartbeat(
        self, node: str, agent_id: str, seq: int, sent_at: float, received_at: float
    ) -> bool:
        """A heartbeat from ``node`` (``sent_at`` on its clock) naming report ``seq``.
        It attests the stored report only if from the same agent, not older, up to when
        the agent built report ``seq`` (``_attested``). Returns whether to pass now: it
        is news of a job awaiting its second judgement, or it takes a job on the node
        past its limit (the first judgement, without waiting for the next tick)."""
        with self._lock:
            last = self._nodes.get(node)
            if last is None or last.agent_id != agent_id or seq < last.seq:
                return False  # another agent (restarted), or an older report: no news
            cycle = last.cycle_s
            if not last.measured and seq > last.seq:
                # Not two reports of this agent yet (it, or this controller, just
                # started): the report and the heartbeat show the cycle, a little long
                # (the heartbeat goes out after the report it stands for was made),
                # which only makes it attest less.
                span = (sent_at - last.generated_at) / (seq - last.seq)
                cycle = min(max(span, MIN_CYCLE_S), MAX_CYCLE_S)
            until = max(last.until, _attested(last, seq, sent_at, cycle))
            due = _due(last.progress, self.cfg) if last.due is None else last.due
            heard = max(last.heard, received_at)
            self._nodes[node] = last._replace(cycle_s=cycle, until=until, heard=heard, due=due)
            return last.until <= due < until or node in self._waking

    def evidence(self, node: str, generated_at: float) -> Evidence | None:
        """How far the report generated at ``generated_at`` (the stored one) is known to
        hold; None if this memory does not know that report (a restart, a race with
        ingest): the report's own time is all there is then."""
        last = self._nodes.get(node)  # one read of a dict: atomic, no lock needed
        if last is None or abs(last.generated_at - generated_at) > 1e-6:
            return None
        return Evidence(last.until, last.heard)

    # -- judgements, from the judge -----------------------------------------------------
    def confirm(self, hangs: Sequence[H], nodes: Mapping[int, Collection[str]]) -> list[H]:
        """This pass's candidate hangs -> those judged at the same step in the pass
        before too (or confirmed already and still hung). Every other job is forgotten:
        two judgements count only when consecutive. ``nodes``: each job's nodes."""
        out: list[H] = []
        pending: dict[int, _Pending] = {}
        with self._lock:
            for hang in hangs[:MAX_PENDING]:
                before = self._pending.get(hang.job_id)
                confirmed = before is not None and before.key == hang.key
                pending[hang.job_id] = _Pending(
                    hang.key, frozenset(nodes.get(hang.job_id, ())), confirmed
                )
                if confirmed:
                    out.append(hang)
            self._pending = pending
            waiting = [(j, p) for j, p in pending.items() if not p.confirmed]
            self._suspects = frozenset(j for j, _ in waiting)
            self._waking = frozenset(n for _, p in waiting for n in p.nodes)
        return out

    def suspects(self) -> frozenset[int]:
        """Jobs judged hung once, awaiting their second judgement."""
        with self._lock:
            return self._suspects
