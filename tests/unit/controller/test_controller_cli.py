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


def test_second_instance_on_the_same_state_refuses(tmp_path: Path) -> None:
    from hyperpod_agent.controller.cli import _LOCKS, _lock_state

    db = tmp_path / "state.db"
    _lock_state(db)
    code = (
        "import sys\nfrom pathlib import Path\nfrom hyperpod_agent.controller.cli import "
        "_lock_state\n_lock_state(Path(sys.argv[1]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(db)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    _LOCKS.pop().close()  # type: ignore[attr-defined]
    assert proc.returncode != 0 and "another controller is running" in proc.stderr
