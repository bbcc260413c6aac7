"""The hang judgement at the shipped cadences, over the simulated cluster of
test_hang_sim.py (agents every 5 s, heartbeats at that cadence while ranks record
progress, passes every 10 s):

1. **No false hang**: healthy jobs (steps of 0.05-600 s, jittered, slow steps, paused
   phases), with agent restarts, transit delays, late messages and skewed node clocks,
   are never declared hung: 10,000 simulated job-hours (in four parts, each a test).
2. **A real hang is declared, within its bound**: a job that stops (all ranks silently,
   all in D state, or one rank SIGSTOPped and the others blocked), watched from its start
   or by a controller that starts later, is declared, never before it has been idle
   past its limit, and within ``BOUND_S`` of that.

10,000 examples in all. The invariants are stated on the simulation's truth (when steps
really happened, the limit the ranks' own summaries give), not on what the judge
computes. Seeded: ``HANG_PROPERTY_SEED=7 pytest -s tests/unit/controller/
test_hang_properties.py`` searches elsewhere (``HANG_PROPERTY_HEALTHY`` and
``HANG_PROPERTY_STOPS`` set how many examples); the seed is printed and named in every
failure.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from test_hang_controller_sim import run
from test_hang_sim import (
    BEAT_S,
    CYCLE_S,
    PASS_S,
    PASS_TAKES_S,
    T0,
    WARMUP_S,
    Spec,
)

from hyperpod_agent.controller.hangs.memory import HangMemory

SEED = int(os.environ.get("HANG_PROPERTY_SEED", "20261127"))
HEALTHY_EXAMPLES = int(os.environ.get("HANG_PROPERTY_HEALTHY", "1252"))  # x 8 job-hours
STOP_EXAMPLES = int(os.environ.get("HANG_PROPERTY_STOPS", "8750"))
JOBS, HOURS = 8, 1.0  # per healthy example: one controller, eight jobs, an hour
PARTS = 4  # each its own test: under pytest's per-test timeout on a busy machine
PACK = 8  # single-node jobs to a node (small jobs sharing an 8-GPU node)
MAX_DELAY_S = 2.0
# How long after a stopped job passed its limit it is declared, at the latest: the
# first report built past the limit (one cycle), the heartbeat naming it (one heartbeat
# interval at most), the transit delay, then two passes (the first may wait a whole
# interval when no heartbeat wakes the loop; the second is the next one).
BOUND_S = BEAT_S + CYCLE_S + MAX_DELAY_S + 2 * (PASS_S + PASS_TAKES_S[1])

# The discrete knobs of a job, drawn as one number (fewer draws: hypothesis's cost per
# draw is most of an example's otherwise; it shrinks towards the first of each).
HEALTHY_KNOBS: dict[str, Sequence[Any]] = {
    "spike": (0.0, 0.01, 0.05),
    "nodes": (1, 1, 1, 1, 1, 2, 3),
    "ranks": (1, 1, 1, 2),
    "pauses": (0, 1, 2),
    "skew_s": (0.0, 0.5, 5.0),
    "delay_s": (0.02, 0.5, MAX_DELAY_S),
    "late": (0.0, 0.002, 0.02),
    "restarts": (0, 1, 2, 3),
}
STOP_KNOBS: dict[str, Sequence[Any]] = {
    "stop": ("deadlock", "dstate", "sigstop"),
    "spike": (0.0, 0.01, 0.05),
    "nodes": (1, 1, 2, 3),
    "ranks": (1, 1, 2),
    "skew_s": (0.0, 0.5, 5.0),
    "delay_s": (0.02, 0.5, MAX_DELAY_S),
    "late_start": (False, True),
}


def search(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def knobs(draw: st.DrawFn, table: dict[str, Sequence[Any]]) -> dict[str, Any]:
    n = draw(st.integers(0, math.prod(len(v) for v in table.values()) - 1))
    out = {}
    for name, values in table.items():
        n, k = divmod(n, len(values))
        out[name] = values[k]
    return out


def step_times() -> st.SearchStrategy[float]:
    """0.05 s to 600 s, uniform in log: as many 0.1-1 s jobs as 60-600 s ones."""
    return st.floats(math.log(0.05), math.log(600.0)).map(math.exp)


@st.composite
def healthy(draw: st.DrawFn) -> Spec:
    step, jitter = draw(step_times()), draw(st.floats(0.0, 0.3))
    return Spec(step_s=step, jitter=jitter, hours=HOURS, **knobs(draw, HEALTHY_KNOBS))


@pytest.mark.parametrize("part", range(PARTS))
def test_a_healthy_job_is_never_declared_hung(part: int) -> None:
    print(f"hang properties: seed {SEED} (HANG_PROPERTY_SEED), part {part}")
    job_hours: list[float] = []
    suspected: list[int] = []

    @seed(SEED + part)
    @search(HEALTHY_EXAMPLES // PARTS)
    @given(specs=st.lists(healthy(), min_size=JOBS, max_size=JOBS), sim=st.integers(0, 2**32 - 1))
    def prop(specs: list[Spec], sim: int) -> None:
        out = run(specs, sim, pack=PACK, memory=HangMemory())
        assert not out.declared, f"seed {SEED + part}, simulation {sim}, {specs}: {out.detail}"
        job_hours.append(sum(s.hours for s in specs))
        suspected.append(out.suspected)

    prop()
    print(f"  {sum(job_hours):.0f} job-hours, 0 false hangs, {sum(suspected)} single judgements")
    assert sum(job_hours) >= JOBS * HOURS * (HEALTHY_EXAMPLES // PARTS)


@st.composite
def stopping(draw: st.DrawFn) -> tuple[Spec, float | None]:
    """A job that stops, and when the controller starts (None: before the job). Past
    min_steps (no judgement before the job has a pace), wherever a step is. A job of
    long steps is mostly watched by a controller that starts late, its store holding
    the reports from before (a restart; and hours of steps are not simulated)."""
    step, jitter = draw(step_times()), draw(st.floats(0.0, 0.3))
    k = knobs(draw, STOP_KNOBS)
    late = k.pop("late_start") or step > 20.0
    # 11 steps (10 step times: min_steps) take at most 11 x 1.6 steps.
    since = T0 + 60 + WARMUP_S + 18 * step if late else None
    after = (since - T0 if since else WARMUP_S + 18 * step) + step * draw(st.floats(0.0, 22.0))
    hours = (after + 6 * step + 300) / 3600  # past any limit and the bound
    spec = Spec(step_s=step, jitter=jitter, hours=hours, stop_after_s=after, **k)
    return spec, since


def test_a_job_that_stops_is_declared_within_the_bound() -> None:
    print(f"hang properties: seed {SEED} (HANG_PROPERTY_SEED)")
    late_by: list[float] = []  # declared - (last step + limit)
    after_stop: list[float] = []  # declared - when the job stopped
    overdue: list[float] = []  # declared - (last step + p95): the next step is late
    target: list[bool] = []  # within 2 x p95 + 10 s + one agent cycle of being overdue

    @seed(SEED)
    @search(STOP_EXAMPLES)
    @given(case=stopping(), sim=st.integers(0, 2**32 - 1))
    def prop(case: tuple[Spec, float | None], sim: int) -> None:
        spec, since = case
        out = run([spec], sim, memory=HangMemory(), since=since)
        [t] = out.truths
        n = len(t.steps)
        limit, p95 = t.limit_after(n), t.limits[n][1]
        due = t.last_step + limit  # when it really has been idle past its limit
        at = out.declared.get(t.job_id)
        where = f"seed {SEED}, simulation {sim}, {spec}: limit {limit:.1f} s, {out.detail}"
        assert at is not None, f"never declared: {where}"
        assert at > due, f"declared {due - at:.1f} s before its limit: {where}"
        assert at - due <= BOUND_S, f"declared {at - due:.1f} s after its limit: {where}"
        late_by.append(at - due)
        after_stop.append(at - t.stop_at)
        overdue.append(at - (t.last_step + p95))
        target.append(at - (t.last_step + p95) <= 2 * p95 + 10 + CYCLE_S)

    prop()
    q = statistics.quantiles(late_by, n=20)
    s = statistics.quantiles(after_stop, n=20)
    print(
        f"  {len(late_by)} stops declared; after the limit p50 {q[9]:.1f} s, p95 {q[18]:.1f} s,"
        f" max {max(late_by):.1f} s (bound {BOUND_S:.1f} s); after the stop p50 {s[9]:.1f} s,"
        f" p95 {s[18]:.1f} s; within 2 x p95 + 10 s + a cycle of the next step being late:"
        f" {sum(target) / len(target):.0%}"
    )
