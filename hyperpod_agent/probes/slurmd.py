"""The slurmd probe (placeholder until implemented)."""

from __future__ import annotations

from hyperpod_agent.health import Status
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig


class SlurmdConfig(ProbeConfig):
    pass


class SlurmdProbe(Probe[SlurmdConfig]):
    name = "slurmd"
    config_model = SlurmdConfig

    def check(self) -> Outcome:
        return Outcome(Status.UNKNOWN, "not implemented")
