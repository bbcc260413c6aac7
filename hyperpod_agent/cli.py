"""The ``hyperpod`` command: one click group, subcommands loaded on demand.

Subcommands live next to the code they drive; they are imported only when used, so
``hyperpod health-check`` (run by slurmd) never pays for the controller's imports.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from hyperpod_agent import __version__
from hyperpod_agent.command import run_command

# name -> "module:attribute" of a click command or group
COMMANDS: dict[str, str] = {
    "local-cluster": "hyperpod_agent.localcluster.cli:local_cluster",
    "demo": "hyperpod_agent.demo:demo",
    "agent": "hyperpod_agent.agent.cli:agent",
    "health-check": "hyperpod_agent.agent.healthcheck:health_check",
    "probe": "hyperpod_agent.agent.probe_cli:probe",
    "config": "hyperpod_agent.config_cli:config",
    "controller": "hyperpod_agent.controller.cli:controller",
    "status": "hyperpod_agent.admin.cli:status",
    "nodes": "hyperpod_agent.admin.cli:nodes",
    "node": "hyperpod_agent.admin.cli:node",
    "events": "hyperpod_agent.admin.cli:events",
    "checks": "hyperpod_agent.admin.checks_cli:checks",
    "jobs": "hyperpod_agent.admin.cli:jobs",
    "goodput": "hyperpod_agent.admin.cli:goodput",
    "checkpoint": "hyperpod_agent.checkpoint.cli:checkpoint",
    "auth": "hyperpod_agent.admin.keys:auth",
    "provision": "hyperpod_agent.provision.cli:provision",
    "step-retry": "hyperpod_agent.step_retry:step_retry",
    "simulate": "hyperpod_agent.simulate.cli:simulate",
    "version": "hyperpod_agent.admin.version_cli:version",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module, _, attr = COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hyperpod")
def cli() -> None:
    """HyperPod-grade resilience for Slurm GPU clusters."""


def _run(args: list[str] | None, **extra: Any) -> None:
    run_command(cli, args, prog_name="hyperpod", **extra)


def main() -> None:
    """Entry point of ``hyperpod``."""
    _run(None)


def agent_main() -> None:
    """Entry point of ``hyperpod-agent`` (= ``hyperpod agent run``)."""
    _run(["agent", "run", *sys.argv[1:]])


def controller_main() -> None:
    """Entry point of ``hyperpod-controller`` (= ``hyperpod controller run``)."""
    _run(["controller", "run", *sys.argv[1:]])
