"""hyperpod health-check: exit codes, stale and missing cache, import weight."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hyperpod_agent.agent.healthcheck import (
    EXIT_CONFIG,
    EXIT_FAULTY,
    EXIT_NO_CACHE,
    EXIT_OK,
    EXIT_STALE,
    CheckSettings,
    SettingsError,
    health_check,
    judge,
    read_settings,
)

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def cache(verdict: str = "healthy", age_s: float = 1, **extra: Any) -> dict[str, Any]:
    return {
        "node": "node1",
        "verdict": verdict,
        "generated_at": (NOW - timedelta(seconds=age_s)).isoformat().replace("+00:00", "Z"),
        "action": "NONE",
        "message": "",
        **extra,
    }


def test_healthy() -> None:
    assert judge(cache(), NOW, CheckSettings()) == (EXIT_OK, "node1: healthy")


def test_faulty_names_action_and_reason() -> None:
    code, line = judge(
        cache("faulty", action="REBOOT", urgent=True, message="gpu3 xid79 REBOOT urgent"),
        NOW,
        CheckSettings(),
    )
    assert code == EXIT_FAULTY
    assert line == "node1: faulty (action REBOOT urgent): gpu3 xid79 REBOOT urgent"


def test_degraded_passes_unless_configured() -> None:
    data = cache("degraded", message="disk unknown")
    assert judge(data, NOW, CheckSettings())[0] == EXIT_OK
    assert judge(data, NOW, CheckSettings(degraded_fails=True))[0] == EXIT_FAULTY


def test_stale_is_its_own_class() -> None:
    code, line = judge(cache(age_s=120), NOW, CheckSettings(stale_after_s=60))
    assert code == EXIT_STALE
    assert "cache stale: written 120s ago (limit 60s)" in line


def test_cache_from_the_future_is_stale() -> None:
    code, line = judge(cache(age_s=-600), NOW, CheckSettings(stale_after_s=60))
    assert code == EXIT_STALE and "600s in the future" in line


def test_stale_warn_mode_passes_healthy_but_not_faulty() -> None:
    s = CheckSettings(stale_after_s=60, on_stale="warn")
    code, line = judge(cache(age_s=120), NOW, s)
    assert code == EXIT_OK and line.startswith("warning:")
    assert judge(cache("faulty", age_s=120), NOW, s)[0] == EXIT_FAULTY


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"verdict": "healthy"},
        {"generated_at": "yesterday", "verdict": "healthy"},
        cache("weird"),
    ],
)
def test_malformed(data: dict[str, Any]) -> None:
    assert judge(data, NOW, CheckSettings())[0] == EXIT_NO_CACHE


def invoke(*args: str) -> Any:
    return CliRunner().invoke(health_check, list(args))


def test_cli_missing_cache_distinct_message(tmp_path: Path) -> None:
    result = invoke("--cache", str(tmp_path / "health.json"))
    assert result.exit_code == EXIT_NO_CACHE
    assert "no health cache at" in result.output and "has not run" in result.output


def test_cli_garbage_cache(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    path.write_text("{trunc")
    result = invoke("--cache", str(path))
    assert result.exit_code == EXIT_NO_CACHE and "cannot read health cache" in result.output


def test_cli_reads_settings_from_agent_toml(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    data = cache(age_s=0)
    data["generated_at"] = (datetime.now(UTC) - timedelta(seconds=100)).isoformat()
    path.write_text(json.dumps(data))
    toml = tmp_path / "agent.toml"
    toml.write_text(f'cache_path = "{path}"\n[health_check]\nstale_after_s = 30\n')
    result = invoke("--config", str(toml))
    assert result.exit_code == EXIT_STALE
    assert len(result.output.strip().splitlines()) == 1
    assert invoke("--config", str(toml), "--on-stale", "warn").exit_code == EXIT_OK
    assert invoke("--config", str(toml), "--stale-after", "1000").exit_code == EXIT_OK


def test_cli_fresh_healthy_exit_zero(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    path.write_text(json.dumps({**cache(), "generated_at": datetime.now(UTC).isoformat()}))
    result = invoke("--cache", str(path))
    assert result.exit_code == EXIT_OK, result.output


def test_cli_bad_settings(tmp_path: Path) -> None:
    toml = tmp_path / "agent.toml"
    toml.write_text('[health_check]\non_stale = "maybe"\n')
    result = invoke("--config", str(toml))
    assert result.exit_code == EXIT_CONFIG and "on_stale" in result.output
    with pytest.raises(SettingsError):
        read_settings(tmp_path / "missing.toml")


def test_import_is_light() -> None:
    """health-check must not drag in pydantic, prometheus or the probes."""
    code = (
        "import sys, hyperpod_agent.agent.healthcheck; "
        "print(','.join(m for m in ('pydantic', 'prometheus_client', 'psutil', "
        "'hyperpod_agent.probes', 'hyperpod_agent.health') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == ""


# --- --prolog: only a fresh, urgent fault may refuse a job ------------------------------


def _prolog(tmp_path: Path, data: dict[str, Any] | None, agent: str = "") -> Any:
    path = tmp_path / "health.json"
    if data is not None:
        path.write_text(json.dumps(data))
    toml = tmp_path / "agent.toml"
    toml.write_text(f'cache_path = "{path}"\nnode_name = "node1"\n{agent}')
    return invoke("--prolog", "--config", str(toml))


def _now(verdict: str, **extra: Any) -> dict[str, Any]:
    return {**cache(verdict, **extra), "generated_at": datetime.now(UTC).isoformat()}


@pytest.mark.parametrize(
    "data",
    [
        None,  # the agent never ran: a dead agent must not stop every job
        cache("faulty", age_s=3600, urgent=True, message="stale fault"),
        _now("faulty", urgent=False, message="not urgent"),
        _now("degraded", urgent=True),
        _now("healthy"),
    ],
)
def test_prolog_lets_the_job_start(tmp_path: Path, data: dict[str, Any] | None) -> None:
    result = _prolog(tmp_path, data)
    assert result.exit_code == EXIT_OK, result.output
    assert "the job may start" in result.output


def test_prolog_in_observe_mode_only_says_what_it_would_do(tmp_path: Path) -> None:
    data = _now("faulty", urgent=True, message="gpu0 xid79")
    result = _prolog(tmp_path, data, '[controller]\nurl = "http://127.0.0.1:1"\nmode = "observe"\n')
    assert result.exit_code == EXIT_OK
    assert "node1: would refuse the job and drain: gpu0 xid79" in result.output


def test_prolog_with_an_urgent_fault_and_no_slurm_lets_the_job_start(tmp_path: Path) -> None:
    """Slurm not answering (here: a slurm.conf naming no controller) is no reason to stop
    jobs: the gate only refuses after its drain went through."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=none\nSlurmctldHost=nohost(127.0.0.1)\nSlurmctldPort=1\n")
    agent = f'slurm_conf = "{conf}"\n'
    result = _prolog(tmp_path, _now("faulty", urgent=True, message="gpu0 xid79"), agent)
    assert result.exit_code == EXIT_OK
    assert "node1: cannot drain" in result.output and "job starts" in result.output


def test_prolog_on_a_node_without_agent_config_lets_the_job_start(tmp_path: Path) -> None:
    result = invoke("--prolog", "--config", str(tmp_path / "no-agent.toml"))
    assert result.exit_code == EXIT_OK and "the job may start" in result.output
