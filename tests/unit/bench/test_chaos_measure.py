"""The campaign's measurements: recoveries from the jobs' outputs, the workload's ETTR."""

from __future__ import annotations

import pytest

from bench.chaos_evidence import Attempt, Injection, JobSample, TrainOutput
from bench.chaos_measure import recoveries, step_time, workload_goodput


def attempt(n: int, start: float, steps: range, t0: float, step_s: float = 1.0) -> Attempt:
    stamped = tuple((s, t0 + i * step_s) for i, s in enumerate(steps))
    last = stamped[-1][1] if stamped else start
    return Attempt(n, "node[1-2]", start, steps.start - 1, stamped, last)


def test_a_fault_on_a_jobs_node_recovers_when_its_next_attempt_starts() -> None:
    jobs = [
        JobSample(10.0, 7, "train", "RUNNING", 0, ("node1", "node2")),
        JobSample(10.0, 8, "train", "RUNNING", 0, ("node3",)),
        JobSample(12.0, 7, "train", "RUNNING", 0, ("node1", "node2")),
    ]
    out7 = TrainOutput(
        (attempt(1, 5.0, range(1, 10), 6.0), attempt(2, 15.5, range(6, 20), 17.0)), 19
    )
    out8 = TrainOutput((attempt(1, 5.0, range(1, 30), 6.0),), 29)  # node3 not hit
    injections = [Injection(11.0, "xid79", "node2"), Injection(11.5, "agent_kill", "node3")]
    found = recoveries(injections, jobs, {7: out7, 8: out8})
    assert [(r.kind, r.fault_at, r.running_at) for r in found] == [("xid79", 11.0, 15.5)]


def test_a_job_that_never_runs_again_is_a_recovery_that_never_came() -> None:
    jobs = [JobSample(10.0, 7, "train", "RUNNING", 0, ("node1",))]
    out = TrainOutput((attempt(1, 5.0, range(1, 10), 6.0),), None)
    [r] = recoveries([Injection(11.0, "node_crash", "node1")], jobs, {7: out})
    assert r.running_at is None
    # no sweep before the fault: nothing was known to run there
    assert recoveries([Injection(9.0, "node_crash", "node1")], jobs, {7: out}) == []


def test_workload_goodput_counts_each_step_once_at_the_median_step_time() -> None:
    # 20 steps at 1 s; 5 steps computed again after a restart; wall 5 -> 34 s
    out = TrainOutput(
        (attempt(1, 5.0, range(1, 11), 6.0), attempt(2, 16.0, range(6, 21), 20.0)), 20
    )
    assert step_time(out) == pytest.approx(1.0)
    g = workload_goodput({1: out})
    assert g is not None and g.jobs == 1
    assert g.productive_s == pytest.approx(20.0) and g.wall_s == pytest.approx(29.0)
    assert g.ettr == pytest.approx(20.0 / 29.0)
    assert workload_goodput({}) is None
    assert workload_goodput({1: TrainOutput((attempt(1, 5.0, range(1, 2), 6.0),), None)}) is None
