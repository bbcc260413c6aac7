"""A daemon's config during a rollout may already hold the next release's keys: the
daemon ignores them with a warning each (no crash loop); a wrong value is still an
error, and ``hyperpod config validate`` stays strict."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hyperpod_agent.cli import cli
from hyperpod_agent.controller.config import load_config, parse_config
from hyperpod_agent.errors import ConfigError

NEWER = """
[policy]
mode = "observe"
quarantine_s = 600

[future_section]
enabled = true
"""


def test_the_controller_ignores_the_next_releases_keys_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "controller.toml"
    path.write_text(NEWER)
    config = load_config(path)
    assert config.policy.observe
    assert "policy.quarantine_s: not a key of this release, ignored" in caplog.text
    assert "future_section: not a key of this release, ignored" in caplog.text


def test_a_wrong_value_beside_a_newer_key_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "controller.toml"
    path.write_text(NEWER + '\n[auto_resume]\nretry_on = "sometimes"\n')
    with pytest.raises(ConfigError, match="retry_on"):
        load_config(path)


def test_strict_parsing_and_validate_refuse_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "controller.toml"
    path.write_text(NEWER)
    with pytest.raises(ConfigError, match="quarantine_s|future_section"):
        parse_config(NEWER, path)
    result = CliRunner().invoke(cli, ["config", "validate", "--kind", "controller", str(path)])
    assert result.exit_code != 0 and "not permitted" in result.output + str(result.exception)
