"""``hyperpod auth secret|key``: make the files token mode needs (docs/security.md)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import click

from hyperpod_agent.admin.common import NODE_NAME, one_line_errors
from hyperpod_agent.auth.tokens import derive_key, read_secret
from hyperpod_agent.errors import ConfigError


def _write_private(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only; never overwrite an existing file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} exists; remove it first to replace it") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as out:
        out.write(text)


@click.group("auth")
def auth() -> None:
    """Make the cluster secret and the per-node keys of token authentication."""


@auth.command("secret")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
@one_line_errors
def make_secret(path: Path) -> None:
    """Write a new random cluster secret to PATH (mode 0600), for the controller."""
    _write_private(path, secrets.token_hex(32) + "\n")
    click.echo(f"wrote cluster secret {path}")


@auth.command("key")
@click.option(
    "--secret-file",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The cluster secret.",
)
@click.option("--node", "node_name", help="Derive the key of this node (for its agent).")
@click.option("--admin", is_flag=True, help="Derive the admin key (for admins' admin.toml).")
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the key to this new file (mode 0600) instead of printing it.",
)
@one_line_errors
def make_key(secret_file: Path, node_name: str | None, admin: bool, out: Path | None) -> None:
    """Derive the key of one node (--node NAME) or of admins (--admin)."""
    if (node_name is None) == (not admin):
        raise click.UsageError("give exactly one of --node NAME or --admin")
    if node_name is not None and not NODE_NAME.match(node_name):
        raise click.BadParameter(f"{node_name!r} is not a node name", param_hint="'--node'")
    subject = "admin" if admin else f"node:{node_name}"
    key = derive_key(read_secret(secret_file), subject).hex()
    if out is None:
        click.echo(key)
        return
    _write_private(out, key + "\n")
    click.echo(f"wrote {subject} key {out}")
