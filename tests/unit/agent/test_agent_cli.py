"""The agent, probe and config commands through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hyperpod_agent.agent.cache import read_report
from hyperpod_agent.agent.cli import agent
from hyperpod_agent.agent.probe_cli import probe
from hyperpod_agent.config_cli import config
from hyperpod_agent.errors import ConfigError


@pytest.fixture()
def agent_toml(tmp_path: Path) -> Path:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"generate": 8}))
    path = tmp_path / "agent.toml"
    path.write_text(f"""
node_name = "node1"
cache_path = "{tmp_path / "health.json"}"
[metrics]
enabled = false
[probes.gpu]
backend = "fake"
fake_scenario = "{scenario}"
kmsg_path = ""
expected_count = 8
[probes.slurmd]
enabled = false
[probes.script]
enabled = false
[probes.nic]
enabled = false
[probes.disk]
enabled = false
[probes.cpu]
enabled = false
""")
    return path


def test_agent_once_writes_cache(agent_toml: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(agent, ["run", "--once", "--config", str(agent_toml)])
    assert result.exit_code == 0, result.output
    assert "node1: healthy" in result.output
    report = read_report(tmp_path / "health.json")
    assert [r.probe for r in report.results] == ["gpu"]


def test_agent_once_faulty_exits_1(agent_toml: Path, tmp_path: Path) -> None:
    (tmp_path / "scenario.json").write_text(json.dumps({"generate": 7}))
    result = CliRunner().invoke(agent, ["run", "--once", "--config", str(agent_toml)])
    assert result.exit_code == 1
    assert "faulty action=REBOOT urgent" in result.output


def test_agent_refuses_invalid_config(tmp_path: Path) -> None:
    bad = tmp_path / "agent.toml"
    bad.write_text('[probes.gpu]\nexpected_count = "eight"\n')
    result = CliRunner().invoke(agent, ["run", "--config", str(bad)])
    assert isinstance(result.exception, ConfigError)
    assert "probes.gpu.expected_count" in str(result.exception)


def test_probe_list(agent_toml: Path) -> None:
    result = CliRunner().invoke(probe, ["list", "--config", str(agent_toml)])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].split() == ["PROBE", "ENABLED", "INTERVAL", "TIMEOUT"]
    assert any(line.split()[:2] == ["gpu", "yes"] for line in lines)
    assert any(line.split()[:2] == ["slurmd", "no"] for line in lines)


def test_probe_run_json(agent_toml: Path) -> None:
    result = CliRunner().invoke(probe, ["run", "gpu", "--json", "--config", str(agent_toml)])
    assert result.exit_code == 0, result.output
    [data] = json.loads(result.output)
    assert data["probe"] == "gpu" and data["status"] == "OK"


def test_probe_run_fail_exit_1_and_findings_printed(agent_toml: Path, tmp_path: Path) -> None:
    (tmp_path / "scenario.json").write_text(
        json.dumps({"generate": 8, "xid_events": [{"gpu": 3, "xid": 79}]})
    )
    result = CliRunner().invoke(probe, ["run", "gpu", "--config", str(agent_toml)])
    assert result.exit_code == 1
    assert "gpu3 xid79 FAIL REBOOT urgent" in result.output


def test_probe_run_disabled_probe_by_name_runs_it(agent_toml: Path) -> None:
    result = CliRunner().invoke(probe, ["run", "cpu", "--json", "--config", str(agent_toml)])
    assert [r["probe"] for r in json.loads(result.output)] == ["cpu"]


def test_probe_run_unknown_name(agent_toml: Path) -> None:
    result = CliRunner().invoke(probe, ["run", "fpga", "--config", str(agent_toml)])
    assert result.exit_code == 2 and "no probe 'fpga'" in result.output


def test_config_validate_ok(agent_toml: Path) -> None:
    result = CliRunner().invoke(config, ["validate", str(agent_toml)])
    assert result.exit_code == 0 and "ok (agent config)" in result.output


def test_config_validate_error_names_key(tmp_path: Path) -> None:
    bad = tmp_path / "agent.toml"
    bad.write_text("[verdict]\nfail_after_runs = 0\n")
    result = CliRunner().invoke(config, ["validate", str(bad)])
    assert isinstance(result.exception, ConfigError)
    assert "verdict.fail_after_runs: Input should be greater than or equal to 1" in str(
        result.exception
    )
    assert result.exception.exit_code == 3


def test_config_validate_controller_kind(tmp_path: Path) -> None:
    path = tmp_path / "controller.toml"
    path.write_text("")
    result = CliRunner().invoke(config, ["validate", "--kind", "controller", str(path)])
    # Either the controller's model accepts an empty file or it names what is missing;
    # either way the answer is one line, never a traceback.
    if result.exception is not None:
        assert isinstance(result.exception, ConfigError)
        assert "\n" not in str(result.exception)
    else:
        assert "ok (controller config)" in result.output
