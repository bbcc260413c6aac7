"""The node baseline: what this node had when it was known healthy.

``hyperpod agent baseline`` records it (GPU count and model, NIC ports and interfaces
up, the mounts the disk probe watches) in a small TOML file that agent.toml's
``baseline`` names; the gpu, nic and disk probes then check each node against itself:
a GPU missing, a port or interface of the baseline down, a mount of the baseline gone
are faults, and nothing that is not in the baseline becomes one.

The file is re-read when it changes. A file that cannot be read or is malformed never
stops the agent: the probes go on without it (or with the last good one) and this
``baseline`` probe (``probes/baseline.py``) reports it, once, as a configuration finding
(WARN, action NONE: it never drains or reboots a node).
"""

from __future__ import annotations

import posixpath
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hyperpod_agent.config_files import format_validation_error
from hyperpod_agent.health import Action, Finding, Status

VERSION: Literal[1] = 1


class BaselineError(ValueError):
    """A baseline that cannot be read or does not validate; the message names the file
    and the first bad key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuBaseline(_Strict):
    count: int = Field(ge=0, le=64)
    model: str | None = Field(default=None, min_length=1, max_length=96)


def _port_name(value: str) -> str:
    device, sep, port = value.partition("/")
    if not sep or not device or not port.isdigit() or "/" in port:
        raise ValueError(f"expected <device>/<port> such as mlx5_0/1, got {value!r}")
    return value


class NicBaseline(_Strict):
    ports: list[str] = Field(default_factory=list, description="IB/EFA ports up: mlx5_0/1")
    interfaces: list[str] = Field(default_factory=list, description="netdevs up: eth0")

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: list[str]) -> list[str]:
        return sorted({_port_name(v) for v in value})

    @field_validator("interfaces")
    @classmethod
    def _interfaces(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or "/" in name:
                raise ValueError(f"expected a plain interface name, got {name!r}")
        return sorted(set(value))


class DiskBaseline(_Strict):
    mounts: list[str] = Field(default_factory=list, description="mount points present")

    @field_validator("mounts")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/"):
                raise ValueError(f"expected absolute paths, got {path!r}")
        return sorted({posixpath.normpath(p) for p in value})


class Baseline(_Strict):
    """The whole file. ``gpu`` is absent on a node recorded without the gpu probe."""

    version: Literal[1] = VERSION
    node: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    recorded_at: str = Field(default="", max_length=64)
    gpu: GpuBaseline | None = None
    nic: NicBaseline = Field(default_factory=NicBaseline)
    disk: DiskBaseline = Field(default_factory=DiskBaseline)

    def summary(self) -> str:
        """``8 GPU(s) (NVIDIA H100), 4 port(s), 1 interface(s), 2 mount(s)``."""
        parts = []
        if self.gpu is not None:
            model = f" ({self.gpu.model})" if self.gpu.model else ""
            parts.append(f"{self.gpu.count} GPU(s){model}")
        parts.append(f"{len(self.nic.ports)} port(s)")
        parts.append(f"{len(self.nic.interfaces)} interface(s)")
        parts.append(f"{len(self.disk.mounts)} mount(s)")
        return ", ".join(parts)


def parse_baseline(text: str, source: str = "baseline") -> Baseline:
    """Parse and validate a baseline file's text (pure)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BaselineError(f"{source}: invalid TOML: {exc}") from None
    try:
        return Baseline.model_validate(raw)
    except ValidationError as exc:
        raise BaselineError(format_validation_error(source, exc)) from None


def read_baseline(path: Path) -> Baseline:
    """Read and validate ``path``; BaselineError naming the file on any failure."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise BaselineError(f"{path}: cannot read: {why}") from None
    return parse_baseline(text, str(path))


def _toml_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(_toml_string(v) for v in values) + "]"


def render_baseline(baseline: Baseline) -> str:
    """The TOML text of ``baseline`` (``parse_baseline`` reads it back unchanged)."""
    lines = [
        "# What this node had when it was recorded healthy (hyperpod agent baseline).",
        "# The gpu, nic and disk probes check the node against it; see docs/agent.md.",
        f"version = {baseline.version}",
        f"node = {_toml_string(baseline.node)}",
        f"recorded_at = {_toml_string(baseline.recorded_at)}",
    ]
    if baseline.gpu is not None:
        lines += ["", "[gpu]", f"count = {baseline.gpu.count}"]
        if baseline.gpu.model is not None:
            lines.append(f"model = {_toml_string(baseline.gpu.model)}")
    lines += [
        "",
        "[nic]",
        f"ports = {_toml_list(baseline.nic.ports)}",
        f"interfaces = {_toml_list(baseline.nic.interfaces)}",
        "",
        "[disk]",
        f"mounts = {_toml_list(baseline.disk.mounts)}",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class BaselineView:
    """What the probes use: the baseline in force (None: none) and the problem with
    the file, if any (then ``baseline`` is the last good one, or None)."""

    baseline: Baseline | None = None
    problem: str | None = None


class BaselineSource:
    """The baseline file, re-read when its modification time or size changes; shared by
    the probes (which run in their own threads)."""

    def __init__(self, path: Path, node: str) -> None:
        self.path = path
        self.node = node
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._view = BaselineView()

    def get(self) -> BaselineView:
        """The current view; never raises."""
        with self._lock:
            try:
                st = self.path.stat()
                stamp = (st.st_mtime_ns, st.st_size)
            except OSError:
                stamp = None
            if stamp is None or stamp != self._stamp:
                self._stamp = stamp
                try:
                    baseline = read_baseline(self.path)
                    if baseline.node != self.node:
                        # a copy of another node's: checking against it would lie
                        raise BaselineError(
                            f"{self.path}: recorded on {baseline.node!r}, not on "
                            f"{self.node!r}: record this node's own"
                        )
                    self._view = BaselineView(baseline)
                except BaselineError as exc:
                    self._view = BaselineView(self._view.baseline, str(exc))
            return self._view


def baseline_of(source: BaselineSource | None) -> Baseline | None:
    """The baseline in force, or None (no baseline configured, or none valid yet)."""
    return source.get().baseline if source is not None else None


def config_finding(message: str) -> Finding:
    return Finding(
        component="baseline",
        code="config_baseline",
        status=Status.WARN,
        action=Action.NONE,
        message=message[:512],
    )
