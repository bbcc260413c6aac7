"""Deep checks in the local cluster: the fake diagnostic tools on the check job's PATH,
a suite that uses each of them, and one scenario file that says, per node, what each
tool reports (docs/deep-checks.md, "Fakes"). Gates are off by default; drills turn
them on with their own controller settings."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hyperpod_agent.deepcheck.fakes import install_fakes
from hyperpod_agent.deepcheck.fakes.scenario import SCENARIO_ENV

SUITE = """\
# The local cluster's deep-check suite: every tool is a fake that prints the real
# tool's format (hyperpod_agent/deepcheck/fakes).
[[checks]]
name = "dcgm-quick"
kind = "dcgm"
diag_level = 2
levels = ["quick"]
timeout_s = 30

[[checks]]
name = "dcgm-full"
kind = "dcgm"
diag_level = 3
levels = ["full"]
timeout_s = 60

[[checks]]
name = "nvlink"
kind = "nvlink"
expected_links_per_gpu = 18
timeout_s = 10

[[checks]]
name = "nccl-allreduce"
kind = "nccl"
args = ["-b", "8", "-e", "8G", "-f", "2", "-g", "8"]
min_busbw_gbps = 150
timeout_s = 30

[[checks]]
name = "ib-loopback"
kind = "ib"
min_ib_gbps = 350
levels = ["full"]
timeout_s = 30

[[checks]]
name = "cpu-mem-stress"
kind = "stress"
duration_s = 5
vm = 1
vm_bytes = "16M"
levels = ["full"]
timeout_s = 30
"""


def deep_check_dir(cluster_dir: Path) -> Path:
    return cluster_dir / "deepcheck"


def scenario_path(cluster_dir: Path) -> Path:
    """What the fake tools report, per node (rewritten by drills)."""
    return deep_check_dir(cluster_dir) / "scenario.json"


def write_scenario(cluster_dir: Path, nodes: dict[str, dict[str, Any]]) -> None:
    """Set what the fake tools report: ``{node: {tool: settings}}``; {} all pass."""
    path = scenario_path(cluster_dir)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"nodes": nodes}) + "\n")
    os.replace(tmp, path)


def install(cluster_dir: Path) -> None:
    """Install the fakes, the suite and an all-pass scenario."""
    root = deep_check_dir(cluster_dir)
    install_fakes(root / "bin")
    (root / "results").mkdir(parents=True, exist_ok=True)
    (root / "suite.toml").write_text(SUITE)
    write_scenario(cluster_dir, {})


def controller_section(cluster_dir: Path) -> dict[str, Any]:
    """The controller's ``[deep_checks]`` section that uses what :func:`install` wrote."""
    root = deep_check_dir(cluster_dir)
    path = f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    return {
        "suite": str(root / "suite.toml"),
        "results_dir": str(root / "results"),
        "env": {"PATH": path, SCENARIO_ENV: str(scenario_path(cluster_dir))},
        "spare_level": "quick",
        "margin_s": 30.0,
        "retry_s": 10.0,
    }
