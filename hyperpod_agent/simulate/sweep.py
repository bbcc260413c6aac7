"""A sweep over checkpoint interval and spare-pool size, and what it recommends.

Every point of a sweep meets the same faults (same cluster, days and seed): the points
differ only in what is swept. The recommendation for a target ETTR is the smallest pool
that reaches it, with the interval that does best at that pool size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from hyperpod_agent.simulate.faults import Fault
from hyperpod_agent.simulate.inputs import Inputs
from hyperpod_agent.simulate.result import Scenario, Strategy
from hyperpod_agent.simulate.run import FaultSource, make_faults, simulate

DEFAULT_INTERVALS = (300.0, 600.0, 1800.0, 3600.0, 7200.0)
DEFAULT_SPARE_SHARES = (0.0, 0.005, 0.01, 0.02, 0.04)


def default_spares(nodes: int) -> list[int]:
    """Pool sizes to try: shares of the cluster, at least one step apart."""
    return sorted({min(nodes - 1, round(share * nodes)) for share in DEFAULT_SPARE_SHARES})


@dataclass(frozen=True)
class Point:
    strategy: Strategy
    spares: int
    interval_s: float
    ettr: float


@dataclass(frozen=True)
class Recommendation:
    strategy: Strategy
    target: float
    met: bool
    spares: int
    interval_s: float
    ettr: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy.value,
            "target_ettr": self.target,
            "met": self.met,
            "spares": self.spares,
            "checkpoint_interval_s": self.interval_s,
            "ettr": round(self.ettr, 6),
        }


def run_sweep(
    base: Scenario,
    strategies: Sequence[Strategy],
    intervals: Sequence[float],
    spares: Sequence[int],
    inputs: Inputs,
    source: FaultSource,
    faults: list[Fault] | None = None,
) -> list[Point]:
    """ETTR at every (strategy, spares, interval)."""
    if faults is None:
        faults = make_faults(base, source, inputs)
    points = []
    for strategy in strategies:
        for pool in spares:
            for interval in intervals:
                s = replace(base, strategy=strategy, spares=pool, checkpoint_interval_s=interval)
                result = simulate(s, inputs, faults=faults)
                points.append(Point(strategy, pool, interval, result.ettr))
    return points


def recommend(points: Sequence[Point], target: float) -> list[Recommendation]:
    """Per strategy: the fewest spares reaching ``target`` and the best interval there;
    when none reaches it, the best point found (``met`` False)."""
    out = []
    for strategy in dict.fromkeys(p.strategy for p in points):
        mine = [p for p in points if p.strategy is strategy]
        good = [p for p in mine if p.ettr >= target]
        if good:
            pool = min(p.spares for p in good)
            best = max((p for p in good if p.spares == pool), key=lambda p: p.ettr)
        else:
            best = max(mine, key=lambda p: (p.ettr, -p.spares))
        out.append(
            Recommendation(strategy, target, bool(good), best.spares, best.interval_s, best.ettr)
        )
    return out
