"""The script probe (placeholder until implemented)."""

from __future__ import annotations

from hyperpod_agent.health import Status
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig


class ScriptConfig(ProbeConfig):
    pass


class ScriptProbe(Probe[ScriptConfig]):
    name = "script"
    config_model = ScriptConfig

    def check(self) -> Outcome:
        return Outcome(Status.UNKNOWN, "not implemented")
