"""The simulator's prediction for a campaign's one-job workload, from its own records."""

from __future__ import annotations

import pytest

from bench.chaos_evidence import Attempt, Injection, JobSample, NodeSample, TrainOutput
from bench.chaos_predict import (
    back_in_service,
    campaign_inputs,
    measured_ettr,
    predict,
    sim_faults,
)


def attempt(n: int, start: float, first: int, last: int, t0: float, step_s: float) -> Attempt:
    steps = tuple((s, t0 + (s - first) * step_s) for s in range(first, last + 1))
    return Attempt(n, "node[1-4]", start, first - 1, steps, steps[-1][1])


JOBS = [
    JobSample(t, 7, "train", "RUNNING", 0, ("node1", "node2", "node3", "node4"))
    for t in (0.0, 50.0)
]


def test_faults_map_onto_the_jobs_nodes_and_the_pool_and_leave_out_the_rest() -> None:
    injections = [
        Injection(20.0, "xid79", "node3"),
        Injection(21.0, "leader_kill", "controller-a"),  # no node out: not simulated
        Injection(22.0, "node_crash", "node6", 52.0),  # not the job's: a spare
        Injection(5.0, "xid79", "node1"),  # before the job's first step
    ]
    faults = sim_faults(injections, JOBS, 7, start=10.0, job_size=4, spares=2)
    assert [(f.at, f.node, f.cls.name, f.duration) for f in faults] == [
        (10.0, 2, "gpu_xid", 3600.0),
        (12.0, 4, "node_down", 30.0),
    ]


def test_a_run_without_faults_is_predicted_and_measured_near_one() -> None:
    out = TrainOutput((attempt(1, 0.0, 1, 200, 2.0, 0.3),), 200)
    got = predict([], JOBS, 7, out, job_size=4, spares=2, ckpt_every=5)
    assert got is not None and got.ettr == pytest.approx(1.0, abs=0.01)
    assert measured_ettr(out) == pytest.approx(1.0, abs=0.01)


def test_a_fault_costs_in_the_prediction_what_the_job_start_and_lost_steps_cost() -> None:
    # step 100 at 31.7 s; XID 79 at 32 s; attempt 2 starts 35 s, first step (96) at 38 s
    out = TrainOutput(
        (attempt(1, 0.0, 1, 100, 2.0, 0.3), attempt(2, 35.0, 96, 200, 38.0, 0.3)), 200
    )
    inputs = campaign_inputs(out)
    assert inputs.step_s.median == pytest.approx(0.3)
    assert inputs.job_init_s.median == pytest.approx(2.7)  # 3 s to the first step, less one
    got = predict([Injection(32.0, "xid79", "node2")], JOBS, 7, out, 4, 2, ckpt_every=5)
    measured = measured_ettr(out)
    assert got is not None and measured is not None
    assert got.faults == 1 and 0.5 < got.ettr < 0.99
    assert measured == pytest.approx(200 * 0.3 / (38.0 + 104 * 0.3 - 1.7), rel=1e-6)


def test_a_node_out_of_service_or_idle_outside_the_job_takes_no_simulated_fault() -> None:
    nodes = [
        NodeSample(19.0, "node5", "IDLE", frozenset({"DRAIN"}), "hyperpod:spare"),
        NodeSample(19.0, "node6", "IDLE", frozenset({"DRAIN"}), "hyperpod:reboot gpu3 xid79"),
        NodeSample(19.0, "node7", "IDLE", frozenset(), ""),
    ]
    injections = [
        Injection(20.0, "xid79", "node5"),  # pooled: a spare of the simulated pool
        Injection(21.0, "xid79", "node6"),  # already out: nothing changes
        Injection(22.0, "xid79", "node7"),  # idle, not the job's: no such simulated node
    ]
    faults = sim_faults(injections, JOBS, 7, 0.0, 4, 2, nodes)
    assert [(f.at, f.node) for f in faults] == [(20.0, 4)]


def test_reboots_are_timed_from_our_reason_to_the_node_back_in_service() -> None:
    def n(t: float, reason: str, flags: frozenset[str] = frozenset({"DRAIN"})) -> NodeSample:
        return NodeSample(t, "node2", "IDLE", flags, reason)

    nodes = [
        n(0.0, "", frozenset()),
        n(2.0, "hyperpod:reboot gpu3 xid79"),
        n(4.0, "hyperpod:reboot gpu3 xid79"),
        n(6.0, "hyperpod:check reentry"),
        n(8.0, "", frozenset()),
        n(10.0, "hyperpod:reboot gpu3 xid79"),
        n(13.0, "hyperpod:spare"),
    ]
    assert back_in_service(nodes) == [6.0, 3.0]
    out = TrainOutput((attempt(1, 0.0, 1, 20, 2.0, 0.3),), 20)
    assert campaign_inputs(out, nodes=nodes).reboot_s.samples == (6.0, 3.0)
    assert campaign_inputs(out).reboot_s.median == pytest.approx(3.5)  # none seen
