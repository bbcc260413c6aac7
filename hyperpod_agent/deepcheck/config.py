"""The deep-check suite: an ordered list of checks, each a real tool with its own time
limit, thresholds and level membership (``quick``, ``full``). A TOML file, validated
strictly: every error names the file and the key in one line. Defaults are documented
in docs/deep-checks.md.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hyperpod_agent.config_files import load_model

Level = Literal["quick", "full"]
LEVELS: tuple[Level, ...] = ("quick", "full")

# DCGM's own guidance: level 1 takes seconds, 2 about two minutes, 3 about fifteen
# minutes (longer on big nodes), 4 an hour or more
DCGM_TIMEOUTS_S = {1: 120.0, 2: 600.0, 3: 3600.0, 4: 10800.0}

_NAME = r"^[A-Za-z0-9._-]+$"
_MAX_TIMEOUT_S = 86400.0


class _Check(BaseModel):
    """What every check has."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=_NAME)
    levels: list[Level] = Field(default_factory=lambda: list(LEVELS), min_length=1)
    gating: bool = True
    timeout_s: float = Field(gt=0, le=_MAX_TIMEOUT_S)

    @field_validator("levels")
    @classmethod
    def _unique_levels(cls, value: list[Level]) -> list[Level]:
        if len(set(value)) != len(value):
            raise ValueError(f"duplicate levels in {value}")
        return value


class DcgmCheck(_Check):
    """``dcgmi diag -r <diag_level> -j``."""

    kind: Literal["dcgm"]
    executable: str = "dcgmi"
    diag_level: int = Field(default=1, ge=1, le=4)
    extra_args: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _timeout_by_level(cls, data: Any) -> Any:
        if isinstance(data, dict) and "timeout_s" not in data:
            # a bad level is reported on diag_level; any timeout will do meanwhile
            level = data.get("diag_level", 1)
            known = isinstance(level, int) and level in DCGM_TIMEOUTS_S
            return {**data, "timeout_s": DCGM_TIMEOUTS_S[level if known else 1]}
        return data


class NcclCheck(_Check):
    """nccl-tests ``all_reduce_perf``; ``launcher`` goes before it (``mpirun -np 8``)."""

    kind: Literal["nccl"]
    executable: str = "all_reduce_perf"
    launcher: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=lambda: ["-b", "8", "-e", "8G", "-f", "2", "-g", "1"])
    min_busbw_gbps: float = Field(gt=0)
    timeout_s: float = Field(default=900.0, gt=0, le=_MAX_TIMEOUT_S)


class NvlinkCheck(_Check):
    """``nvidia-smi nvlink --status``."""

    kind: Literal["nvlink"]
    executable: str = "nvidia-smi"
    expected_links_per_gpu: int | None = Field(default=None, ge=1, le=64)
    timeout_s: float = Field(default=60.0, gt=0, le=_MAX_TIMEOUT_S)


class IbCheck(_Check):
    """perftest ``ib_write_bw``: against ``peer`` (whose server someone else starts), or
    when no peer is given, in loopback through this node's own HCA (server and client
    both started here)."""

    kind: Literal["ib"]
    executable: str = "ib_write_bw"
    device: str | None = Field(default=None, min_length=1, max_length=64)
    peer: str | None = Field(default=None, min_length=1, max_length=253)
    port: int | None = Field(default=None, ge=1, le=65535)
    args: list[str] = Field(
        default_factory=lambda: ["-s", "1048576", "-n", "5000", "--report_gbits", "-F"]
    )
    min_ib_gbps: float = Field(gt=0)
    timeout_s: float = Field(default=120.0, gt=0, le=_MAX_TIMEOUT_S)


class StressCheck(_Check):
    """``stress-ng --cpu N --vm N --vm-bytes B --timeout S --metrics-brief [--verify]``."""

    kind: Literal["stress"]
    executable: str = "stress-ng"
    cpu: int = Field(default=0, ge=0, le=4096, description="0: one worker per CPU")
    vm: int = Field(default=2, ge=0, le=4096)
    vm_bytes: str = Field(default="50%", pattern=r"^\d+(%|[bBkKmMgG])?$")
    duration_s: int = Field(default=60, ge=1, le=int(_MAX_TIMEOUT_S))
    verify: bool = True
    extra_args: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _timeout_after_duration(cls, data: Any) -> Any:
        if isinstance(data, dict) and "timeout_s" not in data:
            duration = data.get("duration_s", 60)
            # stress-ng needs time to start and reap its workers after --timeout; a bad
            # duration is reported on duration_s
            extra = duration if isinstance(duration, int) and duration > 0 else 60
            return {**data, "timeout_s": float(extra + 60)}
        return data

    @model_validator(mode="after")
    def _room_to_finish(self) -> StressCheck:
        if self.timeout_s <= self.duration_s:
            raise ValueError(
                f"timeout_s ({self.timeout_s:g}) must exceed duration_s ({self.duration_s})"
            )
        return self


class ScriptCheck(_Check):
    """An admin executable with the agent's script-probe contract: exit 0 OK, 1 FAIL,
    anything else UNKNOWN."""

    kind: Literal["script"]
    path: str
    args: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=300.0, gt=0, le=_MAX_TIMEOUT_S)

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"expected an absolute path to an executable, got {value!r}")
        return posixpath.normpath(value)


Check = Annotated[
    DcgmCheck | NcclCheck | NvlinkCheck | IbCheck | StressCheck | ScriptCheck,
    Field(discriminator="kind"),
]


class Suite(BaseModel):
    """A whole suite file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stop_on_fail: bool = False
    kill_grace_s: float = Field(default=2.0, ge=0, le=60)
    output_limit_bytes: int = Field(default=4 * 1024 * 1024, ge=4096, le=64 * 1024 * 1024)
    checks: list[Check] = Field(min_length=1)

    @field_validator("checks")
    @classmethod
    def _unique_names(cls, checks: list[Check]) -> list[Check]:
        names = [c.name for c in checks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate check names: {', '.join(dupes)}")
        return checks

    def at_level(self, level: str) -> list[Check]:
        """The checks of ``level``, in suite order."""
        return [c for c in self.checks if level in c.levels]


def load_suite(path: Path) -> Suite:
    """Load and validate a suite file; ConfigError naming the file and key."""
    return load_model(path, Suite)
