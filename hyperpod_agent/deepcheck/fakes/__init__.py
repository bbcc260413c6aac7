"""Fake diagnostic tools for machines without GPUs or InfiniBand (the local cluster,
the tests): ``dcgmi``, ``all_reduce_perf``, ``ib_write_bw``, ``nvidia-smi`` and
``stress-ng`` executables that print the real tools' output formats, with outcome,
figures and duration chosen per node by a scenario file (scenario.py).

``install_fakes(dir)`` writes one executable per tool into ``dir`` (a script whose
shebang is this interpreter, so it imports this package); ``fake_env`` puts that
directory first on PATH. The runner only resolves names on PATH, so where the real tools
are installed and no fake directory is on PATH, the real ones run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from hyperpod_agent.deepcheck.fakes.scenario import SCENARIO_ENV, TOOL_MODELS

FAKE_TOOLS: tuple[str, ...] = tuple(TOOL_MODELS)

_SCRIPT = """#!{interpreter}
# Fake {tool} for deep-check drills; see hyperpod_agent/deepcheck/fakes.
import sys

from hyperpod_agent.deepcheck.fakes.tools import main

sys.exit(main({tool!r}, sys.argv[1:]))
"""


def install_fakes(bin_dir: Path, interpreter: str = sys.executable) -> Path:
    """Write the fake tools into ``bin_dir`` (created if needed); returns it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in FAKE_TOOLS:
        path = bin_dir / tool
        path.write_text(_SCRIPT.format(interpreter=interpreter, tool=tool))
        path.chmod(0o755)
    return bin_dir


def fake_env(
    bin_dir: Path,
    scenario: Path | None = None,
    node: str | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``bin_dir`` first on PATH,
    the scenario file and, when given, the node the fakes speak for."""
    env = dict(os.environ if base is None else base)
    rest = env.get("PATH", os.defpath)
    env["PATH"] = f"{bin_dir}{os.pathsep}{rest}" if rest else str(bin_dir)
    if scenario is not None:
        env[SCENARIO_ENV] = str(scenario)
    if node is not None:
        env["SLURMD_NODENAME"] = node
    return env
