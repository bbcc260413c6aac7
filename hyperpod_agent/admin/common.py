"""What every admin command shares: connection options, one-line errors, the client,
and the small helpers that turn the controller's answers into output."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from hyperpod_agent.admin.config import resolve
from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.client import ControllerClient
from hyperpod_agent.errors import HyperpodError

F = TypeVar("F", bound=Callable[..., Any])
NODE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
EVENT_KIND = re.compile(r"^[a-z_]{1,64}$")
MAX_REASON = 160


class CommandError(click.ClickException):
    """A HyperpodError shown as one line, keeping its exit code."""

    def __init__(self, exc: HyperpodError):
        super().__init__(str(exc))
        # click declares exit_code on the class; ours varies with the error.
        setattr(self, "exit_code", exc.exit_code)  # noqa: B010

    def show(self, file: Any = None) -> None:
        click.echo(f"hyperpod: error: {self.message}", err=True)


def one_line_errors(func: F) -> F:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except HyperpodError as exc:
            raise CommandError(exc) from exc

    return wrapper  # type: ignore[return-value]


def connection_options(func: F) -> F:
    """--url, --munge-socket, --config, --timeout (see admin/config.py for precedence)."""
    options = [
        click.option(
            "--url", envvar="HYPERPOD_CONTROLLER_URL", help="Controller URL, http://HOST:PORT."
        ),
        click.option(
            "--munge-socket",
            envvar="HYPERPOD_MUNGE_SOCKET",
            type=click.Path(path_type=Path, dir_okay=False),
            help="munged socket used to prove who you are.",
        ),
        click.option(
            "--config",
            "config_file",
            type=click.Path(path_type=Path, dir_okay=False),
            help="admin.toml to read instead of /etc/hyperpod/admin.toml.",
        ),
        click.option(
            "--timeout", type=click.FloatRange(min=0.1, max=600), help="Seconds per request."
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


json_option = click.option("--json", "as_json", is_flag=True, help="Print the raw JSON answer.")


def make_client(
    url: str | None, munge_socket: Path | None, config_file: Path | None, timeout: float | None
) -> ControllerClient:
    """A client for the configured controller, speaking as an admin (no node)."""
    config = resolve(url=url, munge_socket=munge_socket, config_file=config_file, timeout=timeout)
    return ControllerClient(
        config.controller.url,
        ClientAuth(config.auth),
        config.controller.timeout_s,
        ca_file=config.controller.ca_file,
    )


def _emit(doc: Any, as_json: bool, human: Callable[[Any], str]) -> None:
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(human(doc))


def _rows(doc: Any) -> list[dict[str, Any]]:
    if isinstance(doc, list):
        return [row for row in doc if isinstance(row, dict)]
    raise HyperpodError("controller sent an unexpected answer (expected a list)")


def _obj(doc: Any) -> dict[str, Any]:
    if isinstance(doc, dict):
        return doc
    raise HyperpodError("controller sent an unexpected answer (expected an object)")


def _now() -> datetime:
    return datetime.now(UTC)


def _node_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not NODE_NAME.match(value):
        raise click.BadParameter(f"{value!r} is not a node name")
    return value
