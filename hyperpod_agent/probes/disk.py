"""The disk probe (placeholder until implemented)."""

from __future__ import annotations

from hyperpod_agent.health import Status
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig


class DiskConfig(ProbeConfig):
    pass


class DiskProbe(Probe[DiskConfig]):
    name = "disk"
    config_model = DiskConfig

    def check(self) -> Outcome:
        return Outcome(Status.UNKNOWN, "not implemented")
