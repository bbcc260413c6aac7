"""One call to simulate a scenario: faults drawn for its seed, the run, the result.

The faults depend on the seed, the cluster size, the days and the fault source only, not
on the strategy: strategies compared under one seed meet the very same faults.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.simulate.engine import Sim
from hyperpod_agent.simulate.faults import Fault, ParametricModel, parametric_faults, trace_faults
from hyperpod_agent.simulate.inputs import Inputs
from hyperpod_agent.simulate.result import Result, Scenario
from hyperpod_agent.simulate.trace import Trace, read_trace

DEFAULT_RATE = 3.8  # faults per 1,000 node-days


@dataclass(frozen=True)
class FaultSource:
    """The real trace (bootstrapped, rescaled to ``rate``) or the parametric model."""

    rate: float | None = DEFAULT_RATE  # per 1,000 node-days; None: the trace's own
    trace_path: Path | None = None  # None: the vendored trace
    parametric: ParametricModel | None = None  # set: the parametric model instead
    _trace: list[Trace] = field(default_factory=list, compare=False, repr=False)

    def trace(self) -> Trace:
        """The trace, read once."""
        if not self._trace:
            self._trace.append(read_trace(self.trace_path))
        return self._trace[0]


def make_faults(scenario: Scenario, source: FaultSource, inputs: Inputs) -> list[Fault]:
    """The faults of ``scenario``'s cluster for its seed."""
    rng = random.Random(f"faults:{scenario.seed}")
    if source.parametric is not None:
        rate = DEFAULT_RATE if source.rate is None else source.rate
        return parametric_faults(
            rng, scenario.nodes, scenario.days, rate, inputs.repair_s, source.parametric
        )
    return trace_faults(rng, source.trace(), scenario.nodes, scenario.days, source.rate)


def simulate(
    scenario: Scenario,
    inputs: Inputs,
    source: FaultSource | None = None,
    faults: list[Fault] | None = None,
    config: ControllerConfig | None = None,
) -> Result:
    """Run ``scenario``; ``faults`` (if given) instead of drawing them from ``source``."""
    if faults is None:
        faults = make_faults(scenario, source or FaultSource(), inputs)
    return Sim(scenario, faults, inputs, config).run()
