"""The faults a simulated cluster sees: from the real trace, or from a parametric model.

Trace: each simulated node takes the history of a trace server drawn at random (the
faultless servers included), shifted by a random offset and wrapped around, so one
server's repeats (its lemon-ness, its bursts) stay together while copies of it do not
fault in step. The rate is moved to the target by stretching time (inter-arrival times
scale, repair durations do not). Cross-server correlation in the trace (a switch taking
several servers down at once) is lost by the shifts: the model is per node.

Parametric: per node, Poisson or bursty (gamma inter-arrivals with a coefficient of
variation above 1), a share of lemon nodes carrying a share of the faults, classes drawn
from a mix, repair durations from the inputs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hyperpod_agent.simulate.causes import CLASSES, DEFAULT_MIX, FaultClass
from hyperpod_agent.simulate.inputs import Distribution
from hyperpod_agent.simulate.trace import Trace

DAY = 86400.0


@dataclass(frozen=True)
class Fault:
    """One fault of one simulated node (times in seconds from the start)."""

    at: float
    node: int
    cls: FaultClass
    duration: float  # out of service, unless the controller's remedy ends it sooner
    cause: str = ""  # the trace's cause, when from the trace


@dataclass(frozen=True)
class ParametricModel:
    """Rates by cause, Poisson or bursty, and a lemon share."""

    cv: float = 1.0  # inter-arrival coefficient of variation: 1 Poisson, above 1 bursty
    lemon_nodes: float = 0.0  # share of nodes that are lemons
    lemon_faults: float = 0.0  # share of all faults the lemons carry
    mix: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))

    def __post_init__(self) -> None:
        if not self.cv > 0:
            raise ValueError(f"cv must be > 0, got {self.cv}")
        if not 0.0 <= self.lemon_nodes < 1.0 or not 0.0 <= self.lemon_faults < 1.0:
            raise ValueError("lemon_nodes and lemon_faults must be in [0, 1)")
        if (self.lemon_nodes == 0.0) != (self.lemon_faults == 0.0):
            raise ValueError("lemon_nodes and lemon_faults are both 0 or both > 0")
        unknown = set(self.mix) - set(CLASSES)
        if unknown or not self.mix or any(w < 0 for w in self.mix.values()):
            raise ValueError(f"mix: unknown classes or negative weights: {sorted(unknown)}")


def _arrivals(rng: random.Random, rate_per_s: float, horizon: float, cv: float) -> list[float]:
    """Renewal arrivals in [0, horizon): exponential gaps (cv 1) or gamma gaps, started
    in equilibrium (stationary from the start)."""
    if rate_per_s <= 0:
        return []
    mean = 1.0 / rate_per_s
    shape = 1.0 / (cv * cv)

    def gap() -> float:
        return rng.expovariate(rate_per_s) if cv == 1.0 else rng.gammavariate(shape, mean / shape)

    out: list[float] = []
    # the first gap: the forward recurrence time, a length-biased gap (Gamma(k + 1))
    # times a uniform; for Poisson it is a plain exponential gap
    t = rng.gammavariate(shape + 1.0, mean / shape) * rng.random()
    # bounded: a gap of zero length is measure-zero, and the horizon is finite
    while t < horizon:
        out.append(t)
        t += gap()
    return out


def parametric_faults(
    rng: random.Random,
    nodes: int,
    days: float,
    rate_per_1000: float,
    repair: Distribution,
    model: ParametricModel | None = None,
) -> list[Fault]:
    """Faults of ``nodes`` nodes over ``days`` at ``rate_per_1000`` per 1,000 node-days."""
    model = model or ParametricModel()
    horizon = days * DAY
    base = rate_per_1000 / 1000.0 / DAY
    lemons = round(model.lemon_nodes * nodes)
    if lemons:
        lemon_rate = base * model.lemon_faults * nodes / lemons
        other_rate = base * (1.0 - model.lemon_faults) * nodes / max(1, nodes - lemons)
    else:
        lemon_rate = other_rate = base
    lemon_set = set(rng.sample(range(nodes), lemons)) if lemons else set()
    names = sorted(model.mix)
    weights = [model.mix[n] for n in names]
    out: list[Fault] = []
    for node in range(nodes):
        rate = lemon_rate if node in lemon_set else other_rate
        for at in _arrivals(rng, rate, horizon, model.cv):
            cls = CLASSES[rng.choices(names, weights)[0]]
            out.append(Fault(at, node, cls, repair.sample(rng)))
    out.sort(key=lambda f: (f.at, f.node))
    return out


def trace_faults(
    rng: random.Random, trace: Trace, nodes: int, days: float, rate_per_1000: float | None
) -> list[Fault]:
    """Bootstrap ``nodes`` node histories from the trace (see the module doc)."""
    if rate_per_1000 is not None and rate_per_1000 <= 0:
        return []
    scale = 1.0 if rate_per_1000 is None else trace.rate_per_1000_node_days / rate_per_1000
    period = trace.days * scale * DAY  # one stretched pass over the trace, seconds
    horizon = days * DAY
    laps = math.ceil(horizon / period) + 1
    out: list[Fault] = []
    for node in range(nodes):
        history = trace.histories[rng.randrange(len(trace.histories))]
        if not history:
            continue
        offset = rng.random() * period
        for lap in range(laps):
            for iv in history:
                at = iv.start_d * scale * DAY - offset + lap * period
                if 0.0 <= at < horizon:
                    out.append(Fault(at, node, iv.cls, iv.duration_d * DAY, iv.cause))
    out.sort(key=lambda f: (f.at, f.node))
    return out


def rate_of(faults: Sequence[Fault], nodes: int, days: float) -> float:
    """Faults per 1,000 node-days."""
    return 1000.0 * len(faults) / (nodes * days) if nodes and days else 0.0
