"""The gpu probe (placeholder until implemented)."""

from __future__ import annotations

from hyperpod_agent.health import Status
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig


class GpuConfig(ProbeConfig):
    pass


class GpuProbe(Probe[GpuConfig]):
    name = "gpu"
    config_model = GpuConfig

    def check(self) -> Outcome:
        return Outcome(Status.UNKNOWN, "not implemented")
