"""Runs of the simulator: deterministic per seed, bookkeeping that adds up (hypothesis),
the policy's view giving the same answers as the whole cluster, and the controller's own
decisions visible in what happens."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperpod_agent.simulate.causes import CLASSES
from hyperpod_agent.simulate.engine import Sim
from hyperpod_agent.simulate.faults import Fault, ParametricModel
from hyperpod_agent.simulate.inputs import fixed_inputs, load_inputs
from hyperpod_agent.simulate.result import Scenario, Strategy
from hyperpod_agent.simulate.run import FaultSource, make_faults, simulate

INPUTS = load_inputs()


def test_same_seed_same_output_other_seed_other_output() -> None:
    s = Scenario(32, 2, 8, 15.0, 1800.0, Strategy.REQUEUE, seed=3)
    src = FaultSource(rate=40.0)
    a = simulate(s, INPUTS, src).to_dict(incidents=1000)
    b = simulate(s, INPUTS, src).to_dict(incidents=1000)
    c = simulate(replace(s, seed=4), INPUTS, src).to_dict(incidents=1000)
    assert a == b
    assert a != c
    assert a["incidents"] > 0


def test_strategies_under_one_seed_meet_the_same_faults() -> None:
    s = Scenario(48, 2, 8, 20.0, 1800.0, Strategy.SLURM, seed=5)
    src = FaultSource(rate=40.0)
    faults = make_faults(s, src, INPUTS)
    assert faults == make_faults(replace(s, strategy=Strategy.STEP_RETRY), src, INPUTS)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.integers(8, 40),
    spares=st.integers(0, 3),
    days=st.floats(2.0, 10.0),
    interval=st.floats(60.0, 7200.0),
    rate=st.floats(5.0, 150.0),
    strategy=st.sampled_from(list(Strategy)),
    seed=st.integers(0, 2**16),
    parametric=st.booleans(),
)
def test_the_books_add_up(
    nodes: int, spares: int, days: float, interval: float, rate: float,
    strategy: Strategy, seed: int, parametric: bool,
) -> None:  # fmt: skip
    s = Scenario(nodes, spares, 8, days, interval, strategy, seed)
    model = ParametricModel(cv=2.0, lemon_nodes=0.1, lemon_faults=0.5) if parametric else None
    r = simulate(s, INPUTS, FaultSource(rate=rate, parametric=model))
    assert 0.0 <= r.ettr <= 1.0
    assert abs(sum(r.by_cause.values()) - r.lost_s) <= 1e-6 * r.wall_s
    assert abs(r.kept_s + r.lost_s - r.wall_s) <= 1e-6 * r.wall_s
    assert all(v >= 0 for v in r.by_phase.values())
    assert len(r.incidents) <= r.faults
    assert all(i.down_s >= 0 and i.recompute_s >= 0 for i in r.incidents)


def _run(strategy: Strategy, full_view: bool) -> dict[str, object]:
    s = Scenario(32, 8, 8, 30.0, 1800.0, strategy, seed=11)
    faults = make_faults(s, FaultSource(rate=40.0), INPUTS)
    return Sim(s, faults, INPUTS, full_view=full_view).run().to_dict(incidents=1000)


def test_the_policy_view_decides_as_the_whole_cluster_would() -> None:
    for strategy in (Strategy.REQUEUE, Strategy.STEP_RETRY):
        reduced, whole = _run(strategy, False), _run(strategy, True)
        reduced.pop("policy_calls"), whole.pop("policy_calls")
        assert reduced == whole, strategy


def _one_fault(cls: str, strategy: Strategy, spares: int) -> dict[str, object]:
    """One fault on a job node of an otherwise quiet cluster."""
    s = Scenario(16, spares, 8, 5.0, 1800.0, strategy, seed=1)
    fault = Fault(86400.0, 5, CLASSES[cls], 2 * 86400.0)
    return simulate(s, INPUTS, faults=[fault]).to_dict()


def test_an_urgent_gpu_fault_is_replaced_in_the_loop_and_requeued() -> None:
    out = _one_fault("gpu_xid", Strategy.REQUEUE, spares=2)
    assert out["incidents_by_outcome"] == {"requeue": 1}
    first = out["first_incidents"][0]  # type: ignore[index]
    assert first["down_s"] < 3600  # a spare stood in: no wait for the two-day repair
    pools = [row[1] for row in out["spares_timeline"]]  # type: ignore[union-attr]
    assert min(pools) == 1  # the spare left the pool


def test_without_a_spare_the_requeued_job_waits_for_the_repair() -> None:
    out = _one_fault("gpu_xid", Strategy.REQUEUE, spares=0)
    first = out["first_incidents"][0]  # type: ignore[index]
    assert first["down_s"] > 2 * 86400.0 - 3600


def test_step_retry_swaps_the_spare_into_the_job() -> None:
    out = _one_fault("gpu_xid", Strategy.STEP_RETRY, spares=1)
    assert out["incidents_by_outcome"] == {"step_retry": 1}
    assert out["policy_calls"]["decide_step"] == 1  # type: ignore[index]


def test_a_dead_node_under_a_requeued_job_is_drained_not_replaced() -> None:
    # What the policy does today: a lost heartbeat drains the node (no spare is promised
    # for a drain), so the requeued job waits for its repair. A step retry cannot mend
    # a dead node in place (Slurm keeps the dead node's part of the step): its step's
    # failure is answered REQUEUE, and the job waits the same.
    for strategy in (Strategy.REQUEUE, Strategy.STEP_RETRY):
        out = _one_fault("node_down", strategy, spares=2)
        assert out["first_incidents"][0]["down_s"] > 86400.0, strategy  # type: ignore[index]
        assert "step_retry" not in out["incidents_by_outcome"], strategy  # type: ignore[operator]


def test_slurm_alone_waits_for_the_collective_timeout_and_the_user() -> None:
    inputs = fixed_inputs(slurm_detect_hang_s=600.0, resubmit_wait_s=1800.0, job_init_s=100.0)
    s = Scenario(16, 2, 8, 3.0, 1800.0, Strategy.SLURM, seed=1)
    r = simulate(s, inputs, faults=[Fault(86400.0, 5, CLASSES["gpu_xid"], 86400.0)])
    assert [i.outcome for i in r.incidents] == ["resubmit"]
    assert abs(r.incidents[0].down_s - 2500.0) < 1e-6
    assert abs(r.by_phase["detection"] - 600.0) < 1e-6


def test_faults_at_the_target_rate() -> None:
    s = Scenario(2000, 0, 8, 100.0, seed=2)
    trace = make_faults(s, FaultSource(rate=5.0), INPUTS)
    poisson = make_faults(s, FaultSource(rate=5.0, parametric=ParametricModel()), INPUTS)
    for faults in (trace, poisson):
        assert abs(len(faults) / (2000 * 100.0) * 1000.0 - 5.0) < 0.5
