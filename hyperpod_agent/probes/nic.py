"""The nic probe (placeholder until implemented)."""

from __future__ import annotations

from hyperpod_agent.health import Status
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig


class NicConfig(ProbeConfig):
    pass


class NicProbe(Probe[NicConfig]):
    name = "nic"
    config_model = NicConfig

    def check(self) -> Outcome:
        return Outcome(Status.UNKNOWN, "not implemented")
