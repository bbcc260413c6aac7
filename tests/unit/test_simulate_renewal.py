"""The simulator against the closed-form renewal model of checkpoint/restart.

The model (Young 1974, Daly 2006; the form Meta's reliability papers use for ETTR): a job
on J nodes fails at rate lambda = J x r (r per node and second), memoryless. It saves a
checkpoint every C seconds of training, each save blocking it for b, so one save cycle is
c = C + b. A failure costs a fixed restart overhead R (detection, requeue, start-up,
restore) plus the progress since the last completed save.

Between failures the job runs for T ~ Exp(lambda) and keeps C x floor(T / c) seconds of
progress, so by the renewal-reward theorem

    ETTR = E[kept per cycle] / E[wall per cycle]
         = C x E[floor(T / c)] / (1 / lambda + R)
         = C / (exp(lambda c) - 1) / (1 / lambda + R),

since E[floor(T / c)] = sum_k P(T >= k c) = 1 / (exp(lambda c) - 1). To first order
(lambda c << 1) that is the familiar (C / c) x (1 - lambda (R + c / 2)): each failure
costs the restart plus, on average, half a checkpoint interval of recomputation.

The simulator runs the same job with Poisson faults of one urgent class (a spare is
always free, repairs are short), fixed durations, and the controller's real decisions
(replace in the loop + requeue, back-off off), and must agree within 2 %.
"""

from __future__ import annotations

import math

from hyperpod_agent.controller.config import AutoResumeConfig, ControllerConfig, PolicyConfig
from hyperpod_agent.simulate.faults import ParametricModel
from hyperpod_agent.simulate.inputs import fixed_inputs
from hyperpod_agent.simulate.result import Scenario, Strategy
from hyperpod_agent.simulate.run import FaultSource, simulate

NODES, SPARES, DAYS = 80, 16, 120.0
RATE = 100.0  # per 1,000 node-days: about 770 failures of the 64-node job
C, B = 1800.0, 20.0
DETECT, REQUEUE, INIT, RESTORE = 30.0, 60.0, 240.0, 30.0


def renewal_ettr(lam: float, interval: float, block: float, restart: float) -> float:
    cycle = interval + block
    return interval / math.expm1(lam * cycle) / (1.0 / lam + restart)


def test_renewal_formula_first_order_matches_young_daly() -> None:
    lam = 1e-6
    exact = renewal_ettr(lam, C, B, 360.0)
    first_order = (C / (C + B)) * (1 - lam * (360.0 + (C + B) / 2))
    assert abs(exact - first_order) < 1e-5


def test_ettr_agrees_with_the_renewal_model() -> None:
    inputs = fixed_inputs(
        detect_s=DETECT,
        requeue_restart_s=REQUEUE,
        job_init_s=INIT,
        restore_s=RESTORE,
        checkpoint_block_s=B,
        repair_s=600.0,  # spares come back quickly: the pool never runs dry
        reboot_s=300.0,
        resubmit_wait_s=3600.0,
    )
    # Back-off off and lemons out of reach: the model has neither.
    config = ControllerConfig(
        auto_resume=AutoResumeConfig(backoff_base_s=0.0, backoff_max_s=0.0),
        policy=PolicyConfig(lemon_threshold=1000),
    )
    scenario = Scenario(NODES, SPARES, 8, DAYS, C, Strategy.REQUEUE, seed=7)
    source = FaultSource(rate=RATE, parametric=ParametricModel(mix={"gpu_xid": 1.0}))
    result = simulate(scenario, inputs, source, config=config)
    lam = scenario.job_nodes * RATE / 1000.0 / 86400.0
    expected = renewal_ettr(lam, C, B, DETECT + REQUEUE + INIT + RESTORE)
    assert len(result.incidents) > 500  # enough failures for the average to settle
    assert {i.outcome for i in result.incidents} == {"requeue"}
    assert abs(result.ettr - expected) / expected < 0.02, (result.ettr, expected)
    # and the model is not met by accident: without the recomputation it would be off
    no_recompute = (C / (C + B)) / (1.0 + lam * (DETECT + REQUEUE + INIT + RESTORE))
    assert abs(result.ettr - no_recompute) / no_recompute > 0.03
