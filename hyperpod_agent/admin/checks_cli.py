"""``hyperpod node check NODE...`` and ``hyperpod checks [RUN]``: deep checks on demand.

``--wait`` follows the run (one line per phase) until it is done and exits like the
deep-check command itself: 0 every node OK, 1 a node FAILed, 3 a node UNKNOWN.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from hyperpod_agent.admin import render
from hyperpod_agent.admin.common import (
    _emit,
    _node_name,
    _obj,
    _rows,
    connection_options,
    json_option,
    make_client,
    one_line_errors,
)
from hyperpod_agent.errors import HyperpodError

POLL_S = 1.0
EXIT_BY_OUTCOME = {"OK": 0, "FAIL": 1, "UNKNOWN": 3}


def _names(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for name in value:
        _node_name(ctx, param, name)
    if len(set(value)) != len(value):
        raise click.BadParameter("a node is named twice")
    return value


def exit_status(run: dict[str, Any]) -> int:
    """0 when every node passed, 1 when one failed, 3 when one could not be judged."""
    outcomes = {o.get("outcome") for o in run.get("outcomes") or []}
    if not outcomes:
        return 3
    for worst in ("FAIL", "UNKNOWN"):
        if worst in outcomes:
            return EXIT_BY_OUTCOME[worst]
    return 0


@click.command("check")
@click.argument("names", nargs=-1, required=True, callback=_names)
@click.option("--level", type=click.Choice(["quick", "full"]), default="quick", show_default=True)
@click.option("--wait", is_flag=True, help="Follow the run until it is done; exit by outcome.")
@click.option(
    "--wait-timeout",
    type=click.FloatRange(1, 86400),
    default=7200,
    show_default=True,
    help="Seconds --wait follows the run before giving up (the run goes on).",
)
@click.option("--drain-first", is_flag=True, help="Drain nodes running jobs and wait for them.")
@connection_options
@json_option
@one_line_errors
def node_check(
    names: tuple[str, ...],
    level: str,
    wait: bool,
    wait_timeout: float,
    drain_first: bool,
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Run the deep-check suite on NAMES in a maintenance reservation."""
    client = make_client(url, munge_socket, config_file, timeout)
    run = _obj(client.check(list(names), level, drain_first))
    run_id = int(run["id"])
    if not wait:
        _emit(run, as_json, render.check_run)
        return
    deadline = time.monotonic() + wait_timeout
    phase = ""
    while run.get("phase") != "done":
        if run.get("phase") != phase and not as_json:
            phase = str(run.get("phase"))
            click.echo(f"deep check run {run_id}: {phase}", err=True)
        if time.monotonic() > deadline:
            raise HyperpodError(
                f"deep check run {run_id} not done after {wait_timeout:g} s (still {phase}); "
                f"see hyperpod checks {run_id}"
            )
        time.sleep(POLL_S)
        run = _obj(client.check_run(run_id))
    _emit(run, as_json, render.check_run)
    # sys.exit, not click's Exit: the hyperpod entry point runs click without
    # standalone mode, where Exit becomes a return value
    sys.exit(exit_status(run))


@click.command("checks")
@click.argument("run_id", required=False, type=click.IntRange(min=1))
@connection_options
@json_option
@one_line_errors
def checks(
    run_id: int | None,
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Recent deep-check runs, or one run with every node's checks."""
    client = make_client(url, munge_socket, config_file, timeout)
    if run_id is not None:
        _emit(client.check_run(run_id), as_json, lambda d: render.check_run(_obj(d)))
        return
    _emit(
        client.checks(),
        as_json,
        lambda d: "\n".join(render.check_run(r) for r in _rows(d)) or "no deep check runs",
    )
