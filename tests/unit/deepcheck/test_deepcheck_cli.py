"""``python -m hyperpod_agent.deepcheck run``: a real subprocess against the fakes. Its
exit status is the contract the maintenance job relies on: 0 every gating check OK,
1 a gating check failed, 3 a gating check could not tell, 2 usage or suite error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hyperpod_agent.deepcheck.model import SuiteResult

if TYPE_CHECKING:
    from .conftest import Fakes

SUITE = """
[[checks]]
name = "dcgm-quick"
kind = "dcgm"
diag_level = 1
levels = ["quick"]

[[checks]]
name = "nvlink"
kind = "nvlink"
expected_links_per_gpu = 18

[[checks]]
name = "nccl"
kind = "nccl"
args = ["-b", "1M", "-e", "64M", "-f", "4", "-g", "8"]
min_busbw_gbps = 100
levels = ["full"]
gating = false
"""


def deepcheck(fakes: Fakes, *args: str, node: str = "gpu-001") -> subprocess.CompletedProcess[str]:
    env = fakes.env(node)
    return subprocess.run(
        [sys.executable, "-m", "hyperpod_agent.deepcheck", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def suite_file(tmp_path: Path) -> Path:
    path = tmp_path / "deep-checks.toml"
    path.write_text(SUITE)
    return path


def test_all_gating_checks_ok_exits_0_with_a_json_suite_result(
    fakes: Fakes, suite_file: Path
) -> None:
    done = deepcheck(fakes, "run", "--suite", str(suite_file), "--level", "quick", "--json")
    assert done.returncode == 0, done.stderr
    result = SuiteResult.model_validate_json(done.stdout)
    assert result.outcome.value == "OK"
    assert [r.check for r in result.results] == ["dcgm-quick", "nvlink"]
    assert result.nodes == ["gpu-001"]
    assert json.loads(done.stdout)["results"][1]["figures"]["links_up"] == 144


def test_gating_failure_exits_1(fakes: Fakes, suite_file: Path) -> None:
    fakes.write({"nodes": {"gpu-004": {"nvidia-smi": {"inactive": [[5, 0]]}}}})
    done = deepcheck(fakes, "run", "--suite", str(suite_file), "--json", node="gpu-004")
    assert done.returncode == 1
    nvlink = SuiteResult.model_validate_json(done.stdout).results[1]
    assert nvlink.cause == "nvlink inactive: GPU 5 link 0"


def test_gating_unknown_exits_3(fakes: Fakes, suite_file: Path) -> None:
    (fakes.bin / "dcgmi").unlink()
    done = deepcheck(fakes, "run", "--suite", str(suite_file), "--json")
    assert done.returncode == 3
    assert SuiteResult.model_validate_json(done.stdout).results[0].cause == (
        "dcgmi: not found on PATH"
    )


def test_non_gating_failure_exits_0(fakes: Fakes, suite_file: Path) -> None:
    fakes.write({"defaults": {"all_reduce_perf": {"busbw_gbps": 20}}})
    done = deepcheck(fakes, "run", "--suite", str(suite_file), "--level", "full", "--json")
    assert done.returncode == 0
    nccl = SuiteResult.model_validate_json(done.stdout).results[-1]
    assert (nccl.outcome.value, nccl.gating) == ("FAIL", False)


def test_human_output_names_every_check(fakes: Fakes, suite_file: Path) -> None:
    done = deepcheck(fakes, "run", "--suite", str(suite_file), "--node", "spare-2")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["CHECK", "OUTCOME", "GATING", "SECONDS", "CAUSE"]
    assert lines[1].split()[:3] == ["dcgm-quick", "OK", "yes"]
    assert lines[-1] == "quick on spare-2: OK"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--level", "quick"], "Missing option '--suite'"),
        (["run", "--suite", "SUITE", "--level", "medium"], "'medium' is not one of"),
        (["run", "--suite", "SUITE", "--bogus"], "No such option '--bogus'"),
        (["run", "--suite", "/nonexistent/suite.toml"], "/nonexistent/suite.toml: no such file"),
        (["walk"], "No such command 'walk'"),
    ],
)
def test_usage_errors_exit_2_in_one_line(
    fakes: Fakes, suite_file: Path, args: list[str], message: str
) -> None:
    done = deepcheck(fakes, *[str(suite_file) if a == "SUITE" else a for a in args])
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("deepcheck: error: ")
    assert message in done.stderr


def test_malformed_suite_exits_2_naming_the_key(fakes: Fakes, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(SUITE.replace("expected_links_per_gpu", "expected_links"))
    done = deepcheck(fakes, "run", "--suite", str(bad), "--json")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"deepcheck: error: {bad}: checks.1.nvlink.expected_links: Extra inputs are not "
        "permitted, got 18\n"
    )


def test_level_without_gating_check_exits_2(fakes: Fakes, tmp_path: Path) -> None:
    only = tmp_path / "only-full.toml"
    only.write_text('[[checks]]\nname = "n"\nkind = "nvlink"\nlevels = ["full"]\n')
    done = deepcheck(fakes, "run", "--suite", str(only), "--level", "quick")
    assert done.returncode == 2
    assert done.stderr == "deepcheck: error: no gating check at level 'quick'\n"


def test_out_writes_the_nodes_result_file(fakes: Fakes, suite_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    out.mkdir()
    fakes.write({"nodes": {"gpu-007": {"dcgmi": {"fail": [{"test": "software", "gpu": 1}]}}}})
    res = deepcheck(fakes, "run", "--suite", str(suite_file), "--out", str(out), node="gpu-007")
    assert res.returncode == 1, res.stderr
    written = SuiteResult.model_validate_json((out / "gpu-007.json").read_text())
    assert written.nodes == ["gpu-007"] and written.outcome.value == "FAIL"
    assert [p.name for p in out.iterdir()] == ["gpu-007.json"]  # no temporary file left
