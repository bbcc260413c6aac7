"""The probe contract.

A probe checks one part of a node and says what it found. It never decides what
to do about it beyond suggesting an action per finding; the verdict and the
controller do the rest. A probe that raises or overruns its timeout is turned into
UNKNOWN by the runner: a bug in a probe must never look like a sick node.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from hyperpod_agent.health import Finding, Status

if TYPE_CHECKING:
    from hyperpod_agent.probes._baseline import BaselineSource


class ProbeConfig(BaseModel):
    """Settings every probe has; each probe extends it with its own fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    interval_s: float = Field(default=5.0, gt=0, le=3600)
    timeout_s: float = Field(default=10.0, gt=0, le=600)


@dataclass(frozen=True)
class ProbeContext:
    """Where a probe looks. Every sysfs/procfs/dev read goes through these roots so
    tests can point a probe at a small fake tree. ``state_dir`` (None: keep nothing)
    holds what a probe must remember across agent restarts within one boot;
    ``baseline`` is this node's recorded baseline (None: none configured)."""

    node_name: str
    sysfs_root: Path = Path("/sys")
    procfs_root: Path = Path("/proc")
    devfs_root: Path = Path("/dev")
    slurm_conf: str | None = None
    state_dir: Path | None = None
    baseline: BaselineSource | None = None
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    """What ``Probe.check`` returns; the runner adds name, timing and timestamp."""

    status: Status
    message: str = ""
    findings: list[Finding] = field(default_factory=list)

    @classmethod
    def from_findings(cls, findings: list[Finding], ok_message: str = "ok") -> Outcome:
        """OK when nothing was found, else the worst finding's status, with every
        finding's message joined."""
        if not findings:
            return cls(Status.OK, ok_message, [])
        order = [Status.OK, Status.UNKNOWN, Status.WARN, Status.FAIL]
        worst = max((f.status for f in findings), key=order.index)
        return cls(worst, "; ".join(f"{f.component}: {f.message}" for f in findings), findings)


C = TypeVar("C", bound=ProbeConfig)


class Probe(abc.ABC, Generic[C]):
    """Base class of every probe. Subclasses set ``name`` and ``config_model``."""

    name: ClassVar[str]
    config_model: ClassVar[type[ProbeConfig]]

    def __init__(self, config: C, context: ProbeContext) -> None:
        self.config = config
        self.context = context

    @abc.abstractmethod
    def check(self) -> Outcome:
        """Run the check once. May raise; the runner turns that into UNKNOWN."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (NVML handles, threads) when the agent stops."""
