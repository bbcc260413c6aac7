"""The controller of the simulated cluster (test_hang_sim.py), as shipped: a pass
``reconcile_interval_s`` after the last one ended, and one at once when the memory
says so; every message fed to the memory as ingest feeds it, every pass judging a
snapshot built as gather builds it, with the real ``hangs.judge.judge``. And the
tests of the simulation itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
from test_hang_sim import (
    BEAT_S,
    CYCLE_S,
    HEARTBEAT_S,
    PASS_S,
    PASS_TAKES_S,
    PROGRESS,
    PROGRESS_S,
    T0,
    Host,
    Judge,
    Message,
    Reported,
    Spec,
    Truth,
    agent_messages,
    messages,
    place,
    report,
    summaries,
    truth,
    valid,
)

from hyperpod_agent.controller.hangs.judge import judge
from hyperpod_agent.controller.hangs.memory import HangMemory
from hyperpod_agent.controller.snapshot import NodeHealth, Snapshot
from hyperpod_agent.health import Verdict
from hyperpod_agent.slurm.models import Job, Node


@dataclass
class Outcome:
    declared: dict[int, float]  # job id -> when a hang was first declared
    suspected: int  # passes that judged a job hung without (yet) declaring it
    judged: int  # job-passes
    hung: int  # job-passes that returned a hang
    truths: list[Truth]
    detail: list[str]


def run(
    specs: list[Spec],
    seed: int,
    *,
    pack: int = 1,
    judge_fn: Judge = judge,
    memory: HangMemory | None = None,
    until: float | None = None,
    since: float | None = None,
    keep: bool = False,
) -> Outcome:
    """Simulate ``specs`` side by side under one controller, until ``until`` or the end
    of the longest; a job is no longer judged once a hang is declared (the controller
    would requeue it) unless ``keep`` (to count how often a healthy job is judged hung).
    ``since``: the controller starts then, with what arrived before in its store (its
    memory made from it, as ingest makes it). Without ``memory``, ``judge_fn`` is called
    as the old judge was."""
    rng = np.random.default_rng(seed)
    truths = [truth(k + 1, s, rng, T0 + float(rng.uniform(0, 60))) for k, s in enumerate(specs)]
    end = until or max(t.start + t.spec.hours * 3600 for t in truths)
    hosts = place(truths, pack, rng, end)
    m = messages(hosts, truths, rng, end)
    on = {t.job_id: tuple(h.name for h in hosts if any(u is t for u, _ in h.jobs)) for t in truths}
    nodes = {h.name: Node(name=h.name, state="ALLOCATED") for h in hosts}
    jobs = [
        Job(
            job_id=t.job_id,
            name=f"j{t.job_id}",
            state="RUNNING",
            nodes=on[t.job_id],
            start_time=datetime.fromtimestamp(t.start, UTC),
        )
        for t in truths
    ]
    stored: dict[str, tuple[float, Reported]] = {}  # node -> its stored report
    seen: dict[str, float] = {}  # node -> the last word from it (gather's last_seen)
    health: dict[str, NodeHealth] = {}
    dirty: set[str] = set()
    row: dict[str, Message] = {}  # node -> the message whose report the store holds
    out = Outcome({}, 0, 0, 0, truths, [])

    def feed(msg: Message) -> bool:
        arrival, name, agent, seq, clock, progress = msg
        seen[name] = arrival
        dirty.add(name)
        if progress is None:
            if memory is None:
                return False
            return memory.heartbeat(name, agent, seq, clock, arrival)
        if name not in stored:  # the same fields and bounds as the real models
            for view in progress.views():
                valid(view)
        stored[name] = (clock, progress)
        if memory is None:
            return False
        jp: Any = progress
        return memory.report(name, agent, seq, clock, arrival, jp)

    def judge_at(now: float) -> None:
        for name in dirty:
            generated, reported = stored.get(name, (None, None))
            progress: Any = reported.views() if reported is not None else ()
            health[name] = NodeHealth(Verdict.HEALTHY, generated, seen[name], progress=progress)
        dirty.clear()
        running = [j for j in jobs if keep or j.job_id not in out.declared]
        snap = Snapshot(nodes=nodes, jobs=running, health=health)
        if memory is not None:
            hangs, _ = judge_fn(snap, PROGRESS, now, memory)
            out.suspected += len(memory.suspects())
        else:
            hangs, _ = judge_fn(snap, PROGRESS, now)
        out.judged += len(running)
        out.hung += len(hangs)
        for h in hangs:
            out.declared.setdefault(h.job_id, now)
            out.detail.append(f"t={now - T0:.1f} {h.describe()}")

    tick = T0 + float(rng.uniform(0, PASS_S))
    x, total = 0, len(m)
    if since is not None:  # a controller starting: the store's rows, nothing in memory
        while x < total and m[x].arrival < since:
            arrival, name, agent, seq, clock, progress = m[x]
            seen[name] = arrival
            dirty.add(name)
            if progress is not None:
                stored[name] = (clock, progress)
                row[name] = m[x]
            x += 1
        for name, msg in row.items():
            if memory is not None:
                memory.report(name, msg.agent, msg.seq, msg.clock, msg.arrival)
        tick = since + float(rng.uniform(0, PASS_S))
    while tick <= end and (keep or len(out.declared) < len(truths)):
        while x < total and m[x].arrival <= tick:
            x += 1
            if feed(m[x - 1]):  # ingest wakes the loop: a pass now, the next one after it
                tick = m[x - 1].arrival
                break
        judge_at(tick)
        tick += PASS_S + float(rng.uniform(*PASS_TAKES_S))
    return out


def test_a_stopped_job_is_declared_and_a_healthy_one_is_not() -> None:
    specs = [Spec(step_s=0.5, nodes=2, hours=0.2, stop_after_s=300.0), Spec(step_s=0.5, hours=0.2)]
    out = run(specs, 1, memory=HangMemory())
    [stopped, _] = out.truths
    assert list(out.declared) == [1]
    assert out.declared[1] > stopped.last_step + stopped.limit_after(len(stopped.steps))


# -- the simulation itself ------------------------------------------------------------
def test_the_shipped_cadences_are_what_the_simulation_assumes() -> None:
    # The reporter sends progress in full every cycle at most, and a heartbeat attests
    # only because progress goes out in full before the next heartbeat is due.
    assert (CYCLE_S, PROGRESS_S, HEARTBEAT_S, PASS_S) == (5.0, 5.0, 30.0, 10.0)
    assert BEAT_S == PROGRESS_S  # while ranks record progress: every node here


def test_a_stalled_node_sends_heartbeats_only() -> None:
    rng = np.random.default_rng(1)
    t = truth(1, Spec(step_s=1.0, nodes=1, hours=0.1, stop_after_s=200.0), rng, T0)
    [h] = place([t], 1, rng, T0 + 400)
    send, beat, epoch, seq, _, _ = agent_messages(h, rng, T0 + 400)
    after = send > t.last_step + CYCLE_S
    assert beat[after].all() and np.allclose(np.diff(send[after]), BEAT_S)
    training = (send > t.steps[0] + CYCLE_S) & (send < t.last_step)
    assert training.any() and not beat[training].any()  # 1 s steps: in full every cycle
    assert (np.diff(seq) >= 0).all() and set(epoch.tolist()) == {0}


def test_a_restarted_agent_reports_in_full_first_with_a_new_id() -> None:
    rng = np.random.default_rng(2)
    t = truth(1, Spec(step_s=100.0, nodes=1, hours=0.5), rng, T0)
    h = Host("n", [(t, 0)], spans=[T0, T0 + 600, T0 + 700, T0 + 1800])
    send, beat, epoch, seq, _, _ = agent_messages(h, rng, T0 + 1800)
    assert not ((send > T0 + 600) & (send < T0 + 700)).any()  # down: silent
    first = int(np.flatnonzero(epoch == 1)[0])
    assert not beat[first] and seq[first] == 1


def test_jobs_sharing_a_node_share_its_reports() -> None:
    rng = np.random.default_rng(5)
    fast, slow = (
        truth(k, Spec(step_s=s, nodes=1, hours=0.2), rng, T0) for k, s in ((1, 1), (2, 200))
    )
    [h] = place([fast, slow], 2, rng, T0 + 700)
    m = messages([h], [fast, slow], rng, T0 + 700)
    views = [msg.progress.views() for msg in m if msg.progress is not None]
    assert {tuple(v.job_id for v in vs) for vs in views} == {(1, 2)}


def test_the_simulated_reports_are_valid_reports() -> None:
    spec = Spec(step_s=0.3, nodes=2, ranks=2, hours=0.2, pauses=1, stop="sigstop")
    t = truth(1, replace(spec, stop_after_s=600.0), np.random.default_rng(3), T0)
    summaries(t, np.arange(0, len(t.steps) + 1))
    for i in (0, 1):
        for row in t.states(np.linspace(T0, T0 + 700, 50), i == 0).tolist():
            valid(report(t, i, row, 2.0))


def test_a_healthy_job_never_idles_past_its_limit() -> None:
    # What makes it healthy, checked on the truth alone.
    spec = Spec(step_s=2.0, jitter=0.3, spike=0.05, hours=1.0, pauses=2)
    t = truth(1, spec, np.random.default_rng(4), T0)
    summaries(t, np.arange(11, len(t.steps) + 1))
    gaps = np.diff(t.steps)
    resumes = np.searchsorted(t.steps, t.pause_end)
    gaps[resumes - 1] = t.steps[resumes] - t.pause_end  # a pause ends: its clock restarts
    assert all(g < t.limit_after(n + 1) for n, g in enumerate(gaps) if n + 1 > 10)
