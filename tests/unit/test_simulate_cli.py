"""``hyperpod simulate``: output, JSON, and precise errors with exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hyperpod_agent.cli import cli


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["simulate", *args])
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), (
        res.output
    )
    return res.exit_code, res.output


def test_a_small_run_prints_every_strategy() -> None:
    code, out = run("--nodes", "32", "--days", "5", "--rate", "50")
    assert code == 0, out
    for name in ("slurm", "requeue", "step_retry", "step_retry_memckpt"):
        assert name in out


def test_json_and_sweep() -> None:
    code, out = run(
        "--nodes", "24", "--days", "3", "--rate", "60", "--strategy", "step_retry",
        "--sweep", "--json", "--parametric", "--cv", "1.5",
    )  # fmt: skip
    assert code == 0, out
    data = json.loads(out)
    assert [r["strategy"] for r in data["results"]] == ["step_retry"]
    assert data["recommendations"][0]["strategy"] == "step_retry"
    assert {p["spares"] for p in data["sweep"]} >= {0, 1}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--nodes", "1"], "--nodes"),
        (["--nodes", "10", "--spares", "10"], "10 spares leave no node for the job"),
        (["--trace", "/nonexistent/t.json"], "cannot read"),
        (["--trace", "x.json", "--parametric"], "exclude each other"),
        (["--cv", "2"], "--parametric only"),
        (["--strategy", "magic"], "--strategy"),
        (["--days", "0"], "--days"),
        (["--parametric", "--lemons", "0.5", "0"], "both 0 or both > 0"),
    ],
)
def test_bad_input_is_a_usage_error(args: list[str], says: str) -> None:
    res = CliRunner().invoke(cli, ["simulate", *args])
    assert res.exit_code == 2, res.output
    assert says in res.output
    assert "Traceback" not in res.output


def test_bad_inputs_file_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "inputs.json"
    bad.write_text(json.dumps({"components": {"detect_s": {"value": 1}}}))
    res = CliRunner().invoke(cli, ["simulate", "--inputs", str(bad)])
    assert res.exit_code == 2 and "components missing" in res.output


def test_plots_without_matplotlib_name_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    res = CliRunner().invoke(cli, ["simulate", "--days", "1", "--plots", str(tmp_path)])
    assert res.exit_code == 2
    assert "hyperpod-agent[plots]" in res.output
