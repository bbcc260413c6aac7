"""Running a click command with our error format: one line on stderr, our exit codes.

Shared by the ``hyperpod`` group and the ``python -m`` entry points of its parts, so a
part's own entry point needs nothing from the top-level CLI.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from hyperpod_agent.errors import HyperpodError


def run_command(
    command: click.Command, args: list[str] | None, prog_name: str, **extra: Any
) -> None:
    """Run ``command`` as ``prog_name``; every failure exits with its code and one line."""
    try:
        command.main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.UsageError as exc:
        # One line, like every other error of ours; --help has the long form.
        where = exc.ctx.command_path if exc.ctx else prog_name
        click.echo(f"{where}: error: {exc.format_message()} (see --help)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"hyperpod: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except HyperpodError as exc:
        click.echo(f"hyperpod: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
