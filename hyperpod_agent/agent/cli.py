"""``hyperpod agent run``: the node health agent's command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from hyperpod_agent.command import run_command


def _setup_logging(level: str) -> None:
    # journald adds its own timestamps; keep lines short.
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@click.group()
def agent() -> None:
    """The node health agent."""


@agent.command("run")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="agent.toml (default /etc/hyperpod/agent.toml if it exists)",
)
@click.option("--once", is_flag=True, help="run every probe once, write the cache, exit")
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def run(config_path: Path | None, once: bool, log_level: str) -> None:
    """Run probes, keep the health cache, serve metrics, report to the controller.

    Exits non-zero with one line if the configuration is invalid. With ``--once`` the
    exit status is 1 when the node is faulty, else 0.
    """
    from hyperpod_agent.agent.config import DEFAULT_CONFIG_PATH, load_agent_config
    from hyperpod_agent.agent.daemon import Agent, install_signal_handlers, make_reporter
    from hyperpod_agent.health import Verdict

    _setup_logging(log_level)
    if config_path is None and DEFAULT_CONFIG_PATH.exists():
        config_path = DEFAULT_CONFIG_PATH
    config = load_agent_config(config_path)
    the_agent = Agent(config, reporter=None if once else make_reporter(config))
    if once:
        try:
            report = the_agent.run_once()
        finally:
            the_agent.close()
        click.echo(
            f"{report.node}: {report.verdict.value} action={report.action.value}"
            f"{' urgent' if report.urgent else ''}: {report.message}"
        )
        sys.exit(1 if report.verdict == Verdict.FAULTY else 0)
    install_signal_handlers(the_agent)
    try:
        the_agent.run()
    finally:
        the_agent.close()
    logging.getLogger(__name__).info("agent stopped")


@agent.command("baseline")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="agent.toml (default /etc/hyperpod/agent.toml if it exists)",
)
@click.option(
    "--write",
    "write_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="write the baseline to PATH instead of printing it",
)
@click.option(
    "--check",
    "check_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="compare this node with the baseline in PATH instead of recording one",
)
def baseline(config_path: Path | None, write_path: Path | None, check_path: Path | None) -> None:
    """Record what this healthy node has (GPUs, NIC ports up, mounts) for its probes.

    Prints the baseline (TOML), or writes it with ``--write PATH``; point agent.toml's
    ``baseline`` at that file. ``--check PATH`` exits 0 when the node has everything
    the baseline has, 1 (listing what is missing) when not, 3 when PATH is unreadable
    or malformed.
    """
    from hyperpod_agent.agent import baseline as node_baseline
    from hyperpod_agent.agent.config import DEFAULT_CONFIG_PATH, load_agent_config

    if write_path is not None and check_path is not None:
        raise click.UsageError("--write and --check exclude each other")
    if config_path is None and DEFAULT_CONFIG_PATH.exists():
        config_path = DEFAULT_CONFIG_PATH
    config = load_agent_config(config_path)
    expected = node_baseline.load(check_path) if check_path is not None else None
    actual = node_baseline.gather(config)
    if expected is not None:
        missing = node_baseline.differences(expected, actual)
        for line in missing:
            click.echo(f"{check_path}: {line}")
        if not missing:
            click.echo(f"{check_path}: {config.node_name} matches ({expected.summary()})")
        sys.exit(1 if missing else 0)
    if write_path is None:
        from hyperpod_agent.probes.baseline import render_baseline

        click.echo(render_baseline(actual), nl=False)
        return
    node_baseline.write(write_path, actual)
    click.echo(f"{write_path}: {actual.summary()}")
    if config.baseline is None or config.baseline.resolve() != write_path.resolve():
        click.echo(f'point agent.toml at it: baseline = "{write_path.resolve()}"', err=True)


def main() -> None:
    """``python -m hyperpod_agent.agent.cli``: the same as ``hyperpod agent``."""
    run_command(agent, sys.argv[1:], prog_name="hyperpod agent")


if __name__ == "__main__":
    main()
