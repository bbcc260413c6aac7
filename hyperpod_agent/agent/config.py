"""agent.toml: the agent's whole configuration, validated at load.

Every error names the file, the key path and what was expected, in one line, e.g.
``agent.toml: probes.gpu.expected_count: Input should be a valid integer, got "eight"``.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from hyperpod_agent.agent.cache import DEFAULT_CACHE_PATH
from hyperpod_agent.agent.janitor import MemoryTierConfig
from hyperpod_agent.agent.reporter import ReporterConfig
from hyperpod_agent.agent.verdict import VerdictConfig
from hyperpod_agent.config_files import load_model
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.baseline import BaselineSource
from hyperpod_agent.probes.registry import ProbesConfig
from hyperpod_agent.progress import format as progress_format

DEFAULT_CONFIG_PATH = Path("/etc/hyperpod/agent.toml")
DEFAULT_METRICS_PORT = 9817


def _hostname() -> str:
    # Slurm node names are short host names.
    return socket.gethostname().split(".")[0] or "localhost"


class MetricsConfig(BaseModel):
    """``[metrics]``: the Prometheus endpoint. Loopback by default: exposing it to the
    network is a site decision (set ``address = "0.0.0.0"``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    address: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_METRICS_PORT, ge=0, le=65535)


class HealthCheckConfig(BaseModel):
    """``[health_check]``: how ``hyperpod health-check`` judges the cache."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stale_after_s: float = Field(default=60.0, gt=0, le=86400)
    on_stale: Literal["fail", "warn"] = "fail"
    degraded_fails: bool = False


class AgentConfig(BaseModel):
    """The top level of agent.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_name: str = Field(
        default_factory=_hostname, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$"
    )
    cache_path: Path = DEFAULT_CACHE_PATH
    cycle_s: float | None = Field(
        default=None, gt=0, le=60, description="None: the shortest enabled probe interval"
    )
    sysfs_root: Path = Path("/sys")
    procfs_root: Path = Path("/proc")
    devfs_root: Path = Path("/dev")
    state_dir: Path = Path("/run/hyperpod")
    slurm_conf: str | None = None
    baseline: Path | None = Field(
        default=None,
        description="this node's baseline (hyperpod agent baseline --write PATH); None: none",
    )
    auto_resume_markers: Path | None = Field(
        default=Path("/run/hyperpod/autoresume"),
        description="the SPANK plugin's statedir (plugstack.conf statedir=, which "
        "provisioning and docs/manual-install.md set to /var/lib/hyperpod/autoresume): "
        "srun --auto-resume markers to forward",
    )
    progress_dir: Path = Field(
        default=progress_format.DEFAULT_ROOT,
        description="where training ranks keep their progress records (<job id>/<rank>.prog)",
    )
    progress_stale_s: float = Field(
        default=3600.0,
        ge=60,
        le=30 * 86400,
        description="a record whose process is gone and that did not move for this long is "
        "a leftover: not reported, and its job's directory is removed",
    )
    progress_report_interval_s: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        description="a report whose only change is progress goes at most this often; "
        "None: every cycle",
    )
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    verdict: VerdictConfig = Field(default_factory=VerdictConfig)
    health_check: HealthCheckConfig = Field(default_factory=HealthCheckConfig)
    memory_tier: MemoryTierConfig = Field(default_factory=MemoryTierConfig)
    probes: ProbesConfig = Field(default_factory=ProbesConfig)
    controller: ReporterConfig = Field(default_factory=ReporterConfig)

    def enabled_probes(self) -> dict[str, Any]:
        """name -> probe config, for the enabled probes only. The baseline probe runs
        only when there is a baseline to check."""
        out: dict[str, Any] = {}
        for name in type(self.probes).model_fields:
            cfg = getattr(self.probes, name)
            if cfg.enabled and not (name == "baseline" and self.baseline is None):
                out[name] = cfg
        return out

    def effective_cycle_s(self) -> float:
        """Seconds between verdicts: ``cycle_s`` or the shortest enabled interval."""
        if self.cycle_s is not None:
            return self.cycle_s
        intervals = [c.interval_s for c in self.enabled_probes().values()]
        return min(max(min(intervals, default=5.0), 0.2), 30.0)

    def effective_progress_report_interval_s(self) -> float:
        """Seconds between reports whose only change is progress."""
        if self.progress_report_interval_s is not None:
            return self.progress_report_interval_s
        return self.effective_cycle_s()

    def probe_context(self) -> ProbeContext:
        """Where probes look on this node."""
        return ProbeContext(
            node_name=self.node_name,
            sysfs_root=self.sysfs_root,
            procfs_root=self.procfs_root,
            devfs_root=self.devfs_root,
            slurm_conf=self.slurm_conf,
            state_dir=self.state_dir,
            baseline=(
                BaselineSource(self.baseline, self.node_name) if self.baseline is not None else None
            ),
        )

    @field_validator("progress_dir", "baseline")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value

    @model_validator(mode="after")
    def _stale_after_covers_cycles(self) -> AgentConfig:
        cycle = self.effective_cycle_s()
        if self.health_check.stale_after_s < 2 * cycle:
            raise ValueError(
                f"health_check.stale_after_s ({self.health_check.stale_after_s:g}) must be at "
                f"least twice the cycle ({cycle:g} s), or every slow cycle looks stale"
            )
        return self


def load_agent_config(path: Path | None) -> AgentConfig:
    """Load agent.toml; defaults when ``path`` is None."""
    if path is None:
        return AgentConfig()
    # A rollout may bring the next release's keys before its package: warn, run on.
    return load_model(path, AgentConfig, newer_keys=True)
