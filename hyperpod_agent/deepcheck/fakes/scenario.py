"""The scenario file the fake tools read: per node, per tool, what to report.

``HYPERPOD_FAKE_DEEPCHECK_SCENARIO`` names a JSON file::

    {"pid_file": "/tmp/x/pids",
     "defaults": {"all_reduce_perf": {"busbw_gbps": 180}},
     "nodes": {"gpu-002": {"dcgmi": {"fail": [{"test": "memory", "gpu": 3}]},
                           "nvidia-smi": {"inactive": [[2, 7]]}}}}

A node's settings for a tool are ``defaults[tool]`` updated by ``nodes[node][tool]``.
Without the variable every tool passes. The file is validated whole at every start, so a
typo anywhere is reported (one line on stderr, exit 64) instead of silently ignored.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hyperpod_agent.config_files import format_validation_error

SCENARIO_ENV = "HYPERPOD_FAKE_DEEPCHECK_SCENARIO"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Behaviour(_Strict):
    """What every fake can be told to do instead of, or before, its report."""

    delay_s: float = Field(default=0.0, ge=0, le=3600)
    hang: bool = False
    ignore_sigterm: bool = False
    garbage: bool = False
    exit_code: int | None = Field(default=None, ge=0, le=255)


class DcgmFailure(_Strict):
    test: str = Field(min_length=1)
    gpu: int = Field(ge=0, lt=64)
    message: str | None = None


class DcgmiFake(Behaviour):
    gpus: int = Field(default=8, ge=1, le=64)
    fail: list[DcgmFailure] = Field(default_factory=list)
    runtime_error: str | None = None


class NcclFake(Behaviour):
    busbw_gbps: float = Field(default=180.0, ge=0)
    wrong: int = Field(default=0, ge=0)
    cuda_error: str | None = None


class IbFake(Behaviour):
    bw_gbps: float = Field(default=390.0, ge=0)
    error: str | None = None


class NvidiaSmiFake(Behaviour):
    gpus: int = Field(default=8, ge=1, le=64)
    links: int = Field(default=18, ge=0, le=64)
    link_gbps: float = Field(default=26.562, gt=0)
    # [gpu, link] pairs
    inactive: list[Annotated[list[int], Field(min_length=2, max_length=2)]] = Field(
        default_factory=list
    )


class StressNgFake(Behaviour):
    fail: str | None = None
    bogo_ops_per_s: float = Field(default=1000.0, ge=0)


TOOL_MODELS: dict[str, type[Behaviour]] = {
    "dcgmi": DcgmiFake,
    "all_reduce_perf": NcclFake,
    "ib_write_bw": IbFake,
    "nvidia-smi": NvidiaSmiFake,
    "stress-ng": StressNgFake,
}


class ScenarioError(Exception):
    """The scenario file is unreadable or invalid; one line naming the key."""


class Scenario(_Strict):
    pid_file: str | None = None
    defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    nodes: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_tools(self) -> Scenario:
        places = [("defaults", self.defaults)] + [
            (f"nodes.{node}", tools) for node, tools in self.nodes.items()
        ]
        for where, tools in places:
            unknown = sorted(set(tools) - set(TOOL_MODELS))
            if unknown:
                raise ValueError(
                    f"{where}: unknown tool {unknown[0]!r}, expected one of "
                    f"{', '.join(TOOL_MODELS)}"
                )
        return self

    def settings(self, tool: str, node: str) -> Behaviour:
        """``tool``'s settings on ``node`` (ValidationError when invalid)."""
        merged = {**self.defaults.get(tool, {}), **self.nodes.get(node, {}).get(tool, {})}
        return TOOL_MODELS[tool].model_validate(merged)

    def check_all(self, source: str) -> None:
        """Validate every tool's settings on every node named; ScenarioError on the first
        bad one."""
        for node in ["(defaults)", *self.nodes]:
            for tool in TOOL_MODELS:
                try:
                    self.settings(tool, node)
                except ValidationError as exc:
                    where = "defaults" if node == "(defaults)" else f"nodes.{node}"
                    message = format_validation_error(f"{source}: {where}.{tool}", exc)
                    raise ScenarioError(message) from None


def load_scenario(env: Mapping[str, str]) -> Scenario:
    """The scenario ``env`` names (every tool passing when it names none)."""
    path = env.get(SCENARIO_ENV)
    if not path:
        return Scenario()
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: invalid JSON: {exc}") from None
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(path, exc)) from None
    scenario.check_all(path)
    return scenario


def node_name(env: Mapping[str, str]) -> str:
    """The node a fake speaks for: Slurm's name for it, else the short host name."""
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def record_pids(scenario: Scenario, *pids: int) -> None:
    """Append ``pids`` to the scenario's pid file (one write, so lines never mix)."""
    if scenario.pid_file:
        line = "".join(f"{pid}\n" for pid in pids)
        fd = os.open(scenario.pid_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
