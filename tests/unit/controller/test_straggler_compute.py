"""Stragglers in a synchronous job, from the ranks' own records to the controller's
judgement: the real progress writer, the agent's summary of each record, the judge.

In a data-parallel job every rank's step ends in the same all-reduce, so every rank's
step takes as long as the slowest rank's: step times name nobody. The ranks' compute
times (``progress.step(n, compute_s=...)``) tell the slow one apart."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from ctl_helpers import config, job, node, ts

from hyperpod_agent.agent import progress_reader
from hyperpod_agent.controller.hangs.judge import judge
from hyperpod_agent.controller.snapshot import NodeHealth, Snapshot
from hyperpod_agent.health import JobProgress, Verdict
from hyperpod_agent.progress import format as fmt
from hyperpod_agent.progress import record, writer

JOB = 77
NODES = ("node1", "node2", "node3", "node4")
BASE_S = 0.100  # a rank's compute per step at full speed
COMM_S = 0.030  # the all-reduce, once the slowest rank has arrived


class Lockstep:
    """One rank per node, each with its own record, stepping in lockstep on a clock the
    test moves: every step lasts as long as the slowest rank's compute plus the
    all-reduce, as it does under DDP."""

    def __init__(self, base: Path, monkeypatch: pytest.MonkeyPatch, record_compute: bool) -> None:
        self.clock = 5000.0
        monkeypatch.setattr(writer, "_monotonic", lambda: self.clock)
        self.record_compute = record_compute
        self.paths = [fmt.record_path(base, JOB, r) for r in range(len(NODES))]
        self.writers = [
            writer._Writer(record.create(base, p, record.initial(JOB, r, 0.0, 0.0)), p)
            for r, p in enumerate(self.paths)
        ]
        self.started = time.time() - 60

    def step(self, n: int, compute: list[float]) -> None:
        self.clock += max(compute) + COMM_S
        for w, c in zip(self.writers, compute, strict=True):
            w.record(n, c if self.record_compute else None)

    def snapshot(self) -> tuple[Snapshot, float]:
        """What the controller knows once each node's agent reported its rank."""
        now = time.time()
        health = {}
        for name, path in zip(NODES, self.paths, strict=True):
            summary = progress_reader._summary(fmt.decode(path.read_bytes()), "S")
            jp = JobProgress(job_id=JOB, ranks=[summary])
            health[name] = NodeHealth(Verdict.HEALTHY, now, now, progress=(jp,))
        running = replace(job(JOB, nodes=NODES), start_time=ts(self.started))
        nodes = {n: node(n, state="ALLOCATED") for n in NODES}
        return Snapshot(nodes=nodes, jobs=[running], health=health), now

    def close(self) -> None:
        for w in self.writers:
            w.close()


@pytest.fixture
def make_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[bool], Lockstep]]:
    made: list[Lockstep] = []

    def make(record_compute: bool = True) -> Lockstep:
        made.append(Lockstep(tmp_path / f"progress{len(made)}", monkeypatch, record_compute))
        return made[-1]

    yield make
    for j in made:
        j.close()


def named(j: Lockstep) -> list[str]:
    snap, now = j.snapshot()
    hangs, stragglers = judge(snap, config().progress, now)
    assert hangs == []
    return [s.node for s in stragglers]


def slow_run(j: Lockstep, steps: int) -> dict[int, list[str]]:
    """Rank 2 (node3) at 60 % of its peers' speed; who is named after each step."""
    out = {}
    for n in range(1, steps + 1):
        j.step(n, [BASE_S, BASE_S, BASE_S / 0.6, BASE_S])
        out[n] = named(j)
    return out


def test_a_rank_at_60_percent_speed_is_named_within_30_steps(
    make_job: Callable[[bool], Lockstep],
) -> None:
    found = slow_run(make_job(True), 30)
    first = min((n for n, who in found.items() if who), default=None)
    assert first is not None and first <= 30, "never named"
    assert all(who in ([], ["node3"]) for who in found.values()), found
    assert found[30] == ["node3"]
    # the first pass with straggler_min_steps (20) step times: step 21 (the first step
    # of a process has no duration)
    assert first == config().progress.straggler_min_steps + 1


def test_step_times_alone_name_nobody_in_a_synchronous_job(
    make_job: Callable[[bool], Lockstep],
) -> None:
    # what the controller saw before ranks recorded compute time: the same steps
    found = slow_run(make_job(False), 30)
    assert all(who == [] for who in found.values())


def test_a_uniform_run_of_500_steps_names_none(make_job: Callable[[bool], Lockstep]) -> None:
    rng = random.Random(20260)  # seeded: the same jitter every run
    j = make_job(True)
    for n in range(1, 501):
        # each rank's compute varies by up to 10 % from step to step, as real ones do
        j.step(n, [BASE_S * rng.uniform(0.9, 1.1) for _ in NODES])
        if n >= 20:
            assert named(j) == [], f"step {n}"


def test_a_straggler_says_its_figures_are_compute_times(
    make_job: Callable[[bool], Lockstep],
) -> None:
    j = make_job(True)
    slow_run(j, 25)
    snap, now = j.snapshot()
    (s,) = judge(snap, config().progress, now)[1]
    assert s.node_median_s == pytest.approx(BASE_S / 0.6, rel=1e-5)
    assert s.others_median_s == pytest.approx(BASE_S, rel=1e-5)
    assert "node3 straggles in job 77" in s.describe()
