"""The one explicit list of probes, and the config section that mirrors it.

Adding a probe: one file under probes/, one entry in ``PROBES`` and one field in
``ProbesConfig`` (a test checks that the two agree).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from hyperpod_agent.probes.base import Probe, ProbeConfig
from hyperpod_agent.probes.baseline import BaselineConfig, BaselineProbe
from hyperpod_agent.probes.cpu import CpuConfig, CpuProbe
from hyperpod_agent.probes.disk import DiskConfig, DiskProbe
from hyperpod_agent.probes.gpu import GpuConfig, GpuProbe
from hyperpod_agent.probes.nic import NicConfig, NicProbe
from hyperpod_agent.probes.script import ScriptConfig, ScriptProbe
from hyperpod_agent.probes.slurmd import SlurmdConfig, SlurmdProbe

PROBES: dict[str, type[Probe[ProbeConfig]]] = {
    "gpu": GpuProbe,  # type: ignore[dict-item]
    "nic": NicProbe,  # type: ignore[dict-item]
    "disk": DiskProbe,  # type: ignore[dict-item]
    "cpu": CpuProbe,  # type: ignore[dict-item]
    "slurmd": SlurmdProbe,  # type: ignore[dict-item]
    "script": ScriptProbe,  # type: ignore[dict-item]
    "baseline": BaselineProbe,  # type: ignore[dict-item]
}


class ProbesConfig(BaseModel):
    """``[probes.<name>]`` sections of agent.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: GpuConfig = Field(default_factory=GpuConfig)
    nic: NicConfig = Field(default_factory=NicConfig)
    disk: DiskConfig = Field(default_factory=DiskConfig)
    cpu: CpuConfig = Field(default_factory=CpuConfig)
    slurmd: SlurmdConfig = Field(default_factory=SlurmdConfig)
    script: ScriptConfig = Field(default_factory=ScriptConfig)
    baseline: BaselineConfig = Field(default_factory=BaselineConfig)
