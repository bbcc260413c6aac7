"""The top-level ``hyperpod`` command: every registered subcommand loads, errors are
one line with the right exit code."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from hyperpod_agent import __version__
from hyperpod_agent.cli import COMMANDS, cli


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_registered_command_loads(name: str) -> None:
    ctx = click.Context(cli)
    command = cli.get_command(ctx, name)
    assert isinstance(command, click.Command)
    assert command.help or command.short_help


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hyperpod_agent", *args], capture_output=True, text=True, timeout=60
    )


def test_version() -> None:
    res = run("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"hyperpod, version {__version__}"


def test_usage_errors_are_one_line_with_exit_2() -> None:
    res = run("local-cluster", "up", "--nodes", "many")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--nodes" in lines[0] and lines[0].endswith("(see --help)")


def test_local_cluster_ha_needs_the_services() -> None:
    res = run("local-cluster", "up", "--ha", "--dir", "/nonexistent/hyperpod-ha")
    assert res.returncode == 2
    [line] = res.stderr.strip().splitlines()
    assert "--ha" in line and "--with-services" in line


def test_unknown_command_is_one_line() -> None:
    res = run("frobnicate")
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "frobnicate" in res.stderr
