from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from hyperpod_agent.controller.cli import controller
from hyperpod_agent.errors import ConfigError


def test_help_lists_run() -> None:
    result = CliRunner().invoke(controller, ["--help"])
    assert result.exit_code == 0 and "run" in result.output


def test_bad_config_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("listen_port = 'x'\n")
    result = CliRunner().invoke(controller, ["run", "--config", str(path)])
    assert isinstance(result.exception, ConfigError)
    assert "listen_port" in str(result.exception)


def test_module_entry_prints_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hyperpod_agent.controller.cli",
            "run",
            "--config",
            str(tmp_path / "missing.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines() == [
        f"hyperpod: error: {tmp_path / 'missing.toml'}: no such file"
    ]
