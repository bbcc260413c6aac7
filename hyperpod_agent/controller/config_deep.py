"""``[deep_checks]`` of controller.toml: the deep-check suite the controller runs as a
Slurm job in a maintenance reservation, and the gates that make a node pass it before
it takes work (docs/deep-checks.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hyperpod_agent.deepcheck.config import load_suite
from hyperpod_agent.errors import ConfigError
from hyperpod_agent.safe_paths import unsafe_dir

_FROZEN = ConfigDict(extra="forbid", frozen=True)


GateVerb = Literal["reboot", "reset", "drain"]
DEFAULT_GATE_AFTER: tuple[GateVerb, ...] = ("reboot", "reset")


class DeepCheckConfig(BaseModel):
    """``[deep_checks]``: the deep-check suite run as a Slurm job in a maintenance
    reservation, and the gates that make a node pass it before it takes work
    (docs/deep-checks.md). Off until a suite is named; with a suite both gates are on
    unless set false. Code reads the resolved ``reentry_gate_on`` / ``spare_gate_on``,
    never the raw keys (None there means "left out")."""

    model_config = _FROZEN

    suite: Path | None = Field(default=None, description="the suite file (TOML)")
    command: list[str] = Field(
        default_factory=lambda: [sys.executable, "-m", "hyperpod_agent.deepcheck"],
        min_length=1,
        description="how a node runs the deep-check CLI (the same path on every node)",
    )
    results_dir: Path = Field(
        default=Path("/var/lib/hyperpod/deep-checks"),
        description="where the nodes write their results: shared with the head node",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment of the check job"
    )
    gate_reentry: bool | None = Field(
        default=None,
        description="a node back from a reboot, repair, replacement or admin resume, or "
        "new, must pass (default: on with a suite)",
    )
    gate_after: list[GateVerb] = Field(
        default_factory=lambda: list(DEFAULT_GATE_AFTER),
        description="which of our reasons count as a reboot or repair",
    )
    gate_spares: bool | None = Field(
        default=None, description="spares are qualified before a swap (default: on with a suite)"
    )
    reentry_level: Literal["quick", "full"] = "quick"
    spare_level: Literal["quick", "full"] = "full"
    spare_recheck_h: float = Field(default=24.0, gt=0)
    retry_s: float = Field(
        default=300.0, ge=0, description="after a run that could not start, wait this long"
    )
    margin_s: float = Field(
        default=120.0, ge=10, description="beyond the suite's time limits for the whole run"
    )
    drain_timeout_s: float = Field(default=3600.0, gt=0, description="--drain-first wait")
    max_nodes_per_run: int = Field(default=16, ge=1, le=4096)

    @model_validator(mode="after")
    def _paths(self) -> DeepCheckConfig:
        if (self.gate_reentry or self.gate_spares) and self.suite is None:
            named = [k for k in ("gate_reentry", "gate_spares") if getattr(self, k)]
            raise ValueError(
                f'{" and ".join(named)} = true needs suite = "/path/to/deep-checks.toml"'
            )
        for path in (self.suite, self.results_dir):
            if path is not None and not path.is_absolute():
                raise ValueError(f"{path}: must be an absolute path")
        problem = self.results_dir_problem() if self.suite is not None else None
        if problem is not None:
            raise ValueError(f"results_dir: {problem}")
        return self

    @property
    def reentry_gate_on(self) -> bool:
        """Whether a node must pass a deep check before it takes work again: on with a
        suite unless ``gate_reentry = false``."""
        return self.suite is not None and self.gate_reentry is not False

    @property
    def spare_gate_on(self) -> bool:
        """Whether a spare must be qualified before a swap: on with a suite unless
        ``gate_spares = false``."""
        return self.suite is not None and self.gate_spares is not False

    def results_dir_problem(self) -> str | None:
        """Why ``results_dir`` is unsafe, or None. The check job runs as root the
        ``check.sh`` written there: whoever can write the directory, or any directory
        above it, or a symlink on the way, has root on every node checked. So each
        must be owned by root (or this controller's user) and writable by nobody else
        (``safe_paths``). Checked at load and before every run."""
        return unsafe_dir(self.results_dir, {0, os.geteuid()})


def check_suite(deep: DeepCheckConfig) -> None:
    """Load the suite the config names and check each level a gate runs has a gating
    check: a malformed suite stops the controller (or a reload) with the file's error."""
    assert deep.suite is not None
    suite = load_suite(deep.suite)
    for level in dict.fromkeys((deep.reentry_level, deep.spare_level)):
        if not any(c.gating for c in suite.at_level(level)):
            raise ConfigError(f"{deep.suite}: no gating check at level {level!r}")
