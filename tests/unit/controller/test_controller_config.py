from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hyperpod_agent.controller.config import (
    DEFAULT_PORT,
    ControllerConfig,
    DeepCheckConfig,
    load_config,
    parse_config,
)
from hyperpod_agent.errors import ConfigError
from hyperpod_agent.health import Action

P = Path("/etc/hyperpod/controller.toml")


def test_defaults_work() -> None:
    cfg = ControllerConfig()
    assert cfg.listen_host == "127.0.0.1" and cfg.listen_port == DEFAULT_PORT
    assert cfg.reconcile_interval_s == 10
    assert cfg.policy.max_unhealthy_fraction == 0.10
    assert cfg.policy.dry_run is False
    assert cfg.auto_resume.retry_on == "node_fault"
    assert cfg.provider.kind == "spare_pool"
    assert cfg.max_body_bytes == 256 * 1024


def test_full_file_parses() -> None:
    cfg = parse_config(
        """
listen_port = 9000
state_db = "/tmp/x.db"
reconcile_interval_s = 2
[auth]
mode = "none"
[policy]
dry_run = true
max_unhealthy_fraction = 0.5
[policy.fault_overrides.xid63]
action = "REBOOT"
urgent = true
[auto_resume]
retry_on = "any_failure"
default_attempts = 5
[provider]
kind = "command"
command = ["/usr/local/bin/replace-node"]
""",
        P,
    )
    assert cfg.listen_port == 9000 and cfg.policy.dry_run
    assert cfg.policy.fault_overrides["xid63"].action is Action.REBOOT
    assert cfg.auto_resume.retry_on == "any_failure"
    assert cfg.provider.command == ["/usr/local/bin/replace-node"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("listen_port = 0", "listen_port"),
        ("bogus = 1", "bogus"),
        ("[policy]\nmax_unhealthy_fraction = 1.5", "policy.max_unhealthy_fraction"),
        ("[policy]\nlemon_threshold = 1", "policy.lemon_threshold"),
        ("[policy]\nunknown_knob = 1", "policy.unknown_knob"),
        ("[auto_resume]\nretry_on = 'always'", "auto_resume.retry_on"),
        ("[auto_resume]\nbackoff_base_s = 100\nbackoff_max_s = 10", "backoff_max_s"),
        ("[provider]\nkind = 'command'", "command"),
        ("[provider]\nkind = 'local'", "local_dir"),
        ("[provider]\nkind = 'cloud'", "provider.kind"),
        ("[policy.fault_overrides.xid1]\naction = 'EXPLODE'", "fault_overrides.xid1.action"),
        ("reconcile_interval_s = 120\n[policy]\nheartbeat_timeout_s = 60", "heartbeat_timeout_s"),
        ("[auth]\nmode = 'kerberos'", "auth.mode"),
        ("listen_port = ", "not valid TOML"),
    ],
)
def test_errors_name_file_and_key(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, P)
    message = str(err.value)
    assert message.startswith(str(P))
    assert needle in message


def test_frozen() -> None:
    cfg = ControllerConfig()
    with pytest.raises(ValidationError):
        cfg.listen_port = 1  # type: ignore[misc]


def test_missing_default_file_means_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("hyperpod_agent.controller.config.DEFAULT_PATH", tmp_path / "none.toml")
    assert load_config() == ControllerConfig()


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.toml")


def test_load_explicit_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("listen_port = 9123\n")
    assert load_config(path).listen_port == 9123


def test_retention_must_cover_the_policy_windows() -> None:
    with pytest.raises(ConfigError, match="history_retention_s"):
        parse_config("history_retention_s = 3600\n", P)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", None),
        ('[auto_resume]\ncheckpoint_root = "/fsx/checkpoints"', Path("/fsx/checkpoints")),
    ],
)
def test_checkpoint_root(text: str, expected: Path | None) -> None:
    assert parse_config(text, P).auto_resume.checkpoint_root == expected


def test_checkpoint_root_must_be_absolute() -> None:
    with pytest.raises(ConfigError, match="auto_resume: .*checkpoint_root must be an absolute"):
        parse_config('[auto_resume]\ncheckpoint_root = "ckpt"', P)


# --- [deep_checks] ------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["gate_reentry", "gate_spares"])
def test_a_gate_named_true_without_a_suite_is_an_error_naming_it(tmp_path: Path, key: str) -> None:
    path = tmp_path / "controller.toml"
    path.write_text(f"[deep_checks]\n{key} = true\n")
    with pytest.raises(ConfigError, match=f"deep_checks: .*{key} = true needs suite = "):
        load_config(path)


def test_with_a_suite_both_gates_are_on_by_default() -> None:
    deep = DeepCheckConfig(suite=Path("/etc/hyperpod/deep-checks.toml"))
    assert deep.gate_reentry is None and deep.gate_spares is None  # left out
    assert deep.reentry_gate_on and deep.spare_gate_on


@pytest.mark.parametrize(
    ("keys", "reentry", "spares"),
    [
        ({"gate_reentry": False}, False, True),
        ({"gate_spares": False}, True, False),
        ({"gate_reentry": False, "gate_spares": False}, False, False),
        ({"gate_reentry": True, "gate_spares": True}, True, True),
    ],
)
def test_an_admin_turns_a_gate_off_explicitly(
    keys: dict[str, bool], reentry: bool, spares: bool
) -> None:
    deep = DeepCheckConfig(suite=Path("/etc/hyperpod/deep-checks.toml"), **keys)
    assert (deep.reentry_gate_on, deep.spare_gate_on) == (reentry, spares)


@pytest.mark.parametrize("keys", [{}, {"gate_reentry": False, "gate_spares": False}])
def test_without_a_suite_no_gate_is_on(keys: dict[str, bool]) -> None:
    deep = DeepCheckConfig(**keys)  # false without a suite is no error: nothing to run
    assert not deep.reentry_gate_on and not deep.spare_gate_on


def test_the_gate_defaults_come_from_the_file(tmp_path: Path) -> None:
    suite = tmp_path / "deep-checks.toml"
    suite.write_text("[[checks]]\nname = 'dcgm'\nkind = 'dcgm'\n")
    results = tmp_path / "results"
    path = tmp_path / "controller.toml"
    head = f'[deep_checks]\nsuite = "{suite}"\nresults_dir = "{results}"\n'
    path.write_text(head)
    assert load_config(path).deep_checks.reentry_gate_on
    path.write_text(head + "gate_reentry = false\n")
    off = load_config(path).deep_checks
    assert not off.reentry_gate_on and off.spare_gate_on


def test_a_malformed_suite_stops_the_controller_naming_the_file(tmp_path: Path) -> None:
    suite = tmp_path / "deep-checks.toml"
    suite.write_text("[[checks]]\nname = 'x'\nkind = 'warp-drive'\n")
    path = tmp_path / "controller.toml"
    path.write_text(f'[deep_checks]\nsuite = "{suite}"\n')
    with pytest.raises(ConfigError, match="deep-checks.toml"):
        load_config(path)
    suite.write_text(
        "[[checks]]\nname = 'site'\nkind = 'script'\npath = '/bin/true'\ngating = false\n"
    )
    with pytest.raises(ConfigError, match="no gating check at level 'quick'"):
        load_config(path)
    suite.write_text("[[checks]]\nname = 'dcgm'\nkind = 'dcgm'\n")
    assert load_config(path).deep_checks.suite == suite


def test_deep_check_paths_must_be_absolute(tmp_path: Path) -> None:
    path = tmp_path / "controller.toml"
    path.write_text('[deep_checks]\nresults_dir = "relative/dir"\n')
    with pytest.raises(ConfigError, match="must be an absolute path"):
        load_config(path)
