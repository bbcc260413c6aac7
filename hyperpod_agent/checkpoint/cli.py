"""``hyperpod checkpoint``: list, show, verify and prune a checkpoint tier; serve replicas."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from hyperpod_agent.checkpoint import handshake, inspect, layout
from hyperpod_agent.checkpoint.errors import CheckpointError
from hyperpod_agent.errors import HyperpodError

F = TypeVar("F", bound=Callable[..., Any])
DIR = click.Path(path_type=Path, file_okay=True, dir_okay=True)


def _one_line_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HyperpodError as exc:
            click.echo(f"hyperpod checkpoint: error: {exc}", err=True)
            raise click.exceptions.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@click.group()
def checkpoint() -> None:
    """Inspect and maintain tiered checkpoints."""


@checkpoint.command("ls")
@click.argument("directory", type=DIR)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_one_line_errors
def ls_cmd(directory: Path, as_json: bool) -> None:
    """List the steps of a tier directory."""
    steps = inspect.list_steps(directory)
    if as_json:
        click.echo(json.dumps(steps))
        return
    click.echo(f"{'STEP':>10}  {'RANKS':>7}  {'COMMITTED':9}  {'COMPLETE':8}  SIZE")
    for s in steps:
        ranks = f"{len(s['ranks'])}/{s['world_size'] or '?'}"
        click.echo(
            f"{s['step']:>10}  {ranks:>7}  {'yes' if s['committed'] else 'no':9}  "
            f"{'yes' if s['complete'] else 'no':8}  {_size(s['bytes'])}"
        )


@checkpoint.command("show")
@click.argument("directory", type=DIR)
@click.argument("step", type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_one_line_errors
def show_cmd(directory: Path, step: int, as_json: bool) -> None:
    """Show every rank's leaves of one step."""
    info = inspect.describe(directory, step)
    if as_json:
        click.echo(json.dumps(info))
        return
    click.echo(
        f"step {step}: world size {info['world_size']}, "
        f"{'committed' if info['committed'] else 'not committed'}, "
        f"{'complete' if info['complete'] else 'incomplete'}"
    )
    for r in info["ranks"]:
        click.echo(f"rank {r['rank']} (node {r['node']}): {_size(r['data_size'])}")
        for leaf in r["leaves"]:
            writer = "" if leaf["owner"] == r["rank"] else f"  (written by rank {leaf['owner']})"
            click.echo(
                f"  {leaf['path']}  {leaf['kind']} {leaf['dtype']} "
                f"{tuple(leaf['shape'])}  {_size(leaf['nbytes'])}{writer}"
            )


@checkpoint.command("verify")
@click.argument("directory", type=DIR)
@click.argument("step", type=click.IntRange(min=0), required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_one_line_errors
def verify_cmd(directory: Path, step: int | None, as_json: bool) -> None:
    """Check sizes and checksums of one step, or of every step; exit 1 on any problem."""
    steps = [step] if step is not None else [s["step"] for s in inspect.list_steps(directory)]
    verdicts = [inspect.verify_step(directory, s) for s in steps]
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "step": v.step,
                        "ok": v.ok,
                        "complete": v.complete,
                        "missing_ranks": v.missing,
                        "problems": v.problems,
                    }
                    for v in verdicts
                ]
            )
        )
    else:
        for v in verdicts:
            state = "ok" if v.ok else ("CORRUPT" if v.problems else "incomplete")
            click.echo(f"step {v.step}: {state}")
            if v.missing:
                click.echo(f"  no shard for ranks {v.missing}")
            for p in v.problems:
                click.echo(f"  {p}")
    if not all(v.ok for v in verdicts):
        raise click.exceptions.Exit(1)


@checkpoint.command("prune")
@click.argument("directory", type=DIR)
@click.option(
    "--keep",
    type=click.IntRange(min=1),
    required=True,
    help="Complete steps to keep; older steps are deleted.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_one_line_errors
def prune_cmd(directory: Path, keep: int, as_json: bool) -> None:
    """Delete every step older than the newest KEEP complete ones."""
    root = inspect.open_root(directory)
    committed = any(i.committed for i in layout.scan(root).values())
    removed = layout.prune(root, keep, committed=committed)
    if as_json:
        click.echo(json.dumps({"removed": removed}))
    else:
        click.echo(f"removed {len(removed)} step(s)" + (f": {removed}" if removed else ""))


@checkpoint.command("serve")
@click.option("--dir", "directory", type=DIR, required=True, help="The job's memory directory.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), required=True)
@click.option(
    "--secret-file",
    "--token-file",
    "secret_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The job's secret (first line of the file); default: $HYPERPOD_CHECKPOINT_SECRET. "
    "Required to listen on anything but loopback.",
)
@_one_line_errors
def serve_cmd(directory: Path, host: str, port: int, secret_file: Path | None) -> None:
    """Run a peer replica server for this node's memory tier until interrupted."""
    import os

    from hyperpod_agent.checkpoint.replica import ReplicaServer

    env = "HYPERPOD_CHECKPOINT_SECRET"
    secret = os.environ.get(env) or os.environ.get("HYPERPOD_CHECKPOINT_TOKEN") or None
    if secret_file is not None:
        env = str(secret_file)
        try:
            secret = secret_file.read_text().strip() or None
        except OSError as exc:
            raise CheckpointError(f"{secret_file}: cannot read: {exc.strerror or exc}") from exc
        if secret is None:
            raise CheckpointError(f"{secret_file}: empty secret file")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    server = ReplicaServer(directory, host, port, secret=handshake.as_secret(secret, env))
    logging.getLogger(__name__).info("serving %s on %s:%d", directory, *server.address)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
