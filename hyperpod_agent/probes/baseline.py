"""The baseline probe: is the node's baseline (agent.toml's ``baseline``) readable, valid
and this node's own? The checks against it are the gpu, nic and disk probes'; a bad
file never stops them (they go on without it, or with the last good one) and is
reported here once, as a configuration finding that never drains or reboots.

The file format, its reader and the source the probes share are in ``_baseline.py``.
"""

from __future__ import annotations

from pydantic import Field

from hyperpod_agent.health import Status
from hyperpod_agent.probes._baseline import (
    VERSION,
    Baseline,
    BaselineError,
    BaselineSource,
    BaselineView,
    DiskBaseline,
    GpuBaseline,
    NicBaseline,
    baseline_of,
    config_finding,
    parse_baseline,
    read_baseline,
    render_baseline,
)
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig

__all__ = [
    "VERSION",
    "Baseline",
    "BaselineConfig",
    "BaselineError",
    "BaselineProbe",
    "BaselineSource",
    "BaselineView",
    "DiskBaseline",
    "GpuBaseline",
    "NicBaseline",
    "baseline_of",
    "parse_baseline",
    "read_baseline",
    "render_baseline",
]


class BaselineConfig(ProbeConfig):
    """``[probes.baseline]``: reports problems with the file agent.toml's ``baseline``
    names. The checks against the baseline are the gpu, nic and disk probes'."""

    interval_s: float = Field(default=60.0, gt=0, le=3600)


class BaselineProbe(Probe[BaselineConfig]):
    name = "baseline"
    config_model = BaselineConfig

    def check(self) -> Outcome:
        """Is the baseline readable, valid and this node's own?"""
        source = self.context.baseline
        if source is None:
            return Outcome(Status.OK, "no baseline configured")
        view = source.get()
        findings = []
        if view.problem is not None:
            kept = "; the last good one stays in force" if view.baseline else ""
            findings.append(config_finding(f"{view.problem}{kept}"))
        ok = f"{source.path}: {view.baseline.summary()}" if view.baseline else "no baseline"
        return Outcome.from_findings(findings, ok_message=ok)
