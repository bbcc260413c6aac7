"""``hyperpod config validate``: check an agent or controller config without starting."""

from __future__ import annotations

import importlib
from pathlib import Path

import click

from hyperpod_agent.errors import ConfigError


@click.group()
def config() -> None:
    """Configuration files."""


@config.command("validate")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--kind", type=click.Choice(["agent", "controller"]), default="agent", show_default=True
)
def validate(path: Path, kind: str) -> None:
    """Validate PATH; exit 0 and print "ok", or exit 3 with the key that is wrong."""
    from pydantic import BaseModel

    from hyperpod_agent.config_files import load_model

    model: type[BaseModel]
    if kind == "agent":
        from hyperpod_agent.agent.config import AgentConfig

        model = AgentConfig
    else:
        try:
            module = importlib.import_module("hyperpod_agent.controller.config")
            model = module.ControllerConfig
        except (ImportError, AttributeError):
            raise ConfigError(
                "controller config validation is not available in this build "
                "(hyperpod_agent.controller.config:ControllerConfig missing)"
            ) from None
    load_model(path, model)
    click.echo(f"{path}: ok ({kind} config)")
