"""agent.toml loading: defaults, errors naming file and key, cross-field checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperpod_agent.agent.config import AgentConfig, load_agent_config
from hyperpod_agent.config_files import load_model
from hyperpod_agent.errors import ConfigError


def load(tmp_path: Path, text: str) -> AgentConfig:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return load_agent_config(path)


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")
    assert cfg.cache_path == Path("/run/hyperpod/health.json")
    assert cfg.metrics.address == "127.0.0.1"
    assert cfg.verdict.fail_after_runs == 2
    assert cfg.node_name


def test_none_path_gives_defaults() -> None:
    assert load_agent_config(None) == AgentConfig()


def test_full_example(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
node_name = "node7"
cache_path = "/tmp/h.json"
cycle_s = 2
[metrics]
port = 9999
[verdict]
fail_after_runs = 3
grace_s = 10
[health_check]
stale_after_s = 20
on_stale = "warn"
[probes.gpu]
backend = "fake"
fake_scenario = "/tmp/s.json"
expected_count = 8
xid_actions = { "13" = "MONITOR", "79" = { action = "REPLACE", urgent = true } }
[probes.script]
enabled = false
""",
    )
    assert cfg.node_name == "node7" and cfg.probes.gpu.expected_count == 8
    assert "script" not in cfg.enabled_probes()
    assert cfg.effective_cycle_s() == 2
    assert cfg.probes.gpu.xid_overrides()[79].urgent is True


def test_wrong_type_names_file_key_and_value(tmp_path: Path) -> None:
    msg = error(tmp_path, '[probes.gpu]\nexpected_count = "eight"\n')
    assert msg == (
        f"{tmp_path / 'agent.toml'}: probes.gpu.expected_count: "
        'Input should be a valid integer, got "eight"'
    )


def strict_error(tmp_path: Path, text: str) -> str:
    """What ``hyperpod config validate`` says: unknown keys are errors there."""
    path = tmp_path / "agent.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_model(path, AgentConfig)
    return str(info.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[metrics]\nprot = 1\n", "metrics.prot"),
        ("[probes.fpga]\nenabled = true\n", "probes.fpga"),
        ("[controller]\nnope = 1\n", "controller.nope"),
    ],
)
def test_an_unknown_key_is_a_warning_for_the_daemon_and_an_error_for_validate(
    tmp_path: Path, text: str, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A rollout may bring the next release's keys before its package: the agent runs
    on (a crash loop would take the node's health reporting away); validate refuses."""
    assert load(tmp_path, text) == AgentConfig()
    assert f"{key}: not a key of this release, ignored" in caplog.text
    assert f"{key}: Extra inputs are not permitted" in strict_error(tmp_path, text)


def test_cross_field_fake_backend(tmp_path: Path) -> None:
    msg = error(tmp_path, '[probes.gpu]\nbackend = "fake"\n')
    assert "probes.gpu: " in msg and "fake_scenario" in msg


def test_stale_after_must_cover_two_cycles(tmp_path: Path) -> None:
    msg = error(tmp_path, "cycle_s = 10\n[health_check]\nstale_after_s = 15\n")
    assert "stale_after_s (15) must be at least twice the cycle (10 s)" in msg


def test_invalid_toml_names_file(tmp_path: Path) -> None:
    msg = error(tmp_path, "[metrics\n")
    assert msg.startswith(str(tmp_path / "agent.toml")) and "invalid TOML" in msg


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_agent_config(tmp_path / "nope.toml")


def test_multiple_errors_counted(tmp_path: Path) -> None:
    assert "(and 1 more)" in error(tmp_path, '[metrics]\nport = -1\nenabled = "x"\n')


def test_cycle_defaults_to_shortest_enabled_interval(tmp_path: Path) -> None:
    cfg = load(tmp_path, "[probes.cpu]\ninterval_s = 1\n[probes.gpu]\ninterval_s = 5\n")
    assert cfg.effective_cycle_s() == 1


def test_frozen(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")
    with pytest.raises(ValueError):
        cfg.node_name = "x"


def test_node_name_pattern(tmp_path: Path) -> None:
    assert "node_name" in error(tmp_path, 'node_name = "bad name"\n')


def test_bad_xid_action_names_key(tmp_path: Path) -> None:
    msg = error(tmp_path, '[probes.gpu]\nxid_actions = { "79" = "EXPLODE" }\n')
    assert "probes.gpu.xid_actions.79" in msg


def test_bad_on_stale_value(tmp_path: Path) -> None:
    msg = error(tmp_path, '[health_check]\non_stale = "maybe"\n')
    assert "health_check.on_stale" in msg and '"maybe"' in msg


def test_probe_interval_bounds(tmp_path: Path) -> None:
    assert "probes.nic.interval_s" in error(tmp_path, "[probes.nic]\ninterval_s = 0\n")


def test_metrics_port_range(tmp_path: Path) -> None:
    assert "metrics.port" in error(tmp_path, "[metrics]\nport = 70000\n")


def test_probe_context_uses_roots(tmp_path: Path) -> None:
    cfg = load(tmp_path, 'node_name = "n9"\nsysfs_root = "/tmp/sys"\nprocfs_root = "/tmp/proc"\n')
    ctx = cfg.probe_context()
    assert (ctx.node_name, ctx.sysfs_root, ctx.procfs_root) == (
        "n9",
        Path("/tmp/sys"),
        Path("/tmp/proc"),
    )


def test_all_probes_disabled_cycle_defaults_to_five(tmp_path: Path) -> None:
    text = "".join(
        f"[probes.{n}]\nenabled = false\n"
        for n in ("gpu", "nic", "disk", "cpu", "slurmd", "script")
    )
    cfg = load(tmp_path, text)
    assert cfg.enabled_probes() == {} and cfg.effective_cycle_s() == 5.0


def test_progress_defaults(tmp_path: Path) -> None:
    cfg = load(tmp_path, "cycle_s = 2\n")
    assert cfg.progress_dir == Path("/dev/shm/hyperpod-progress")
    assert cfg.progress_stale_s == 3600
    assert cfg.progress_report_interval_s is None
    assert cfg.effective_progress_report_interval_s() == 2
    cfg = load(tmp_path, "cycle_s = 2\nprogress_report_interval_s = 15\n")
    assert cfg.effective_progress_report_interval_s() == 15


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("progress_stale_s = 0", "progress_stale_s: Input should be greater than or equal to 60"),
        ("progress_report_interval_s = 0", "progress_report_interval_s: Input should be greater"),
        ("progress_report_interval_s = 100000", "progress_report_interval_s: Input should be less"),
        ('progress_dir = ""', "progress_dir: must be an absolute path"),
        ('progress_dir = "relative/dir"', "progress_dir: must be an absolute path"),
    ],
)
def test_progress_keys_are_checked(tmp_path: Path, text: str, expected: str) -> None:
    assert error(tmp_path, text).startswith(f"{tmp_path / 'agent.toml'}: {expected}")


def test_controller_urls_a_list_or_comma_separated(tmp_path: Path) -> None:
    listed = load(tmp_path, '[controller]\nurls = ["http://h1:8787", "http://h2:8787/"]\n')
    assert listed.controller.controller_urls() == ("http://h1:8787", "http://h2:8787")
    commas = load(tmp_path, '[controller]\nurl = "http://h1:8787, http://h2:8787"\n')
    assert commas.controller.controller_urls() == ("http://h1:8787", "http://h2:8787")
    single = load(tmp_path, '[controller]\nurl = "http://h1:8787"\n')
    assert single.controller.url == "http://h1:8787"
    assert single.controller.controller_urls() == ("http://h1:8787",)
    assert load(tmp_path, "").controller.controller_urls() == ()


def test_controller_urls_errors_name_the_key(tmp_path: Path) -> None:
    assert "controller.urls" in error(tmp_path, '[controller]\nurls = ["ftp://h1"]\n')
    both = '[controller]\nurl = "http://a:1"\nurls = ["http://b:2"]\n'
    assert "url or urls, not both" in error(tmp_path, both)
