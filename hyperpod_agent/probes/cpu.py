"""The cpu probe (placeholder until implemented)."""

from __future__ import annotations

from hyperpod_agent.health import Status
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig


class CpuConfig(ProbeConfig):
    pass


class CpuProbe(Probe[CpuConfig]):
    name = "cpu"
    config_model = CpuConfig

    def check(self) -> Outcome:
        return Outcome(Status.UNKNOWN, "not implemented")
