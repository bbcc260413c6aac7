"""``python -m hyperpod_agent.deepcheck run --suite FILE --level quick --json``: the command
a maintenance job runs on every node.

Exit status: 0 when every gating check is OK, 1 when a gating check FAILs, 3 when a
gating check is UNKNOWN (and none failed), 2 on a usage or suite error (one line on
stderr, nothing on stdout).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from hyperpod_agent.deepcheck.config import LEVELS, load_suite
from hyperpod_agent.deepcheck.model import SuiteResult
from hyperpod_agent.deepcheck.runner import run_suite
from hyperpod_agent.errors import HyperpodError

PROG = "deepcheck"
EXIT_USAGE = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def deepcheck() -> None:
    """Deep health checks: real diagnostic tools, judged into OK, FAIL or UNKNOWN."""


def _table(result: SuiteResult) -> str:
    rows = [("CHECK", "OUTCOME", "GATING", "SECONDS", "CAUSE")]
    for r in result.results:
        gating = "yes" if r.gating else "no"
        rows.append((r.check, r.outcome.value, gating, f"{r.duration_s:.1f}", r.cause))
    rows += [(name, "SKIPPED", "-", "-", "a gating check failed") for name in result.skipped]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    ]
    lines.append(f"{result.level} on {','.join(result.nodes)}: {result.outcome.value}")
    return "\n".join(lines)


def _write_result(out_dir: Path, result: SuiteResult) -> None:
    """``OUT/<node>.json`` by write-then-rename: a reader never sees half a result."""
    target = out_dir / f"{result.nodes[0]}.json"
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(result.model_dump_json(indent=2), encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise click.ClickException(f"cannot write {target}: {exc.strerror}") from exc


@deepcheck.command("run")
@click.option(
    "--suite",
    "suite_path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The suite file (TOML).",
)
@click.option("--level", type=click.Choice(LEVELS), default="quick", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the SuiteResult as JSON.")
@click.option(
    "--node",
    "nodes",
    multiple=True,
    help="Node the results speak for (default: SLURMD_NODENAME or the host name).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Also write the SuiteResult to OUT/<node>.json (atomically): a maintenance job's "
    "per-node result.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log every check on stderr.")
def run_command(
    suite_path: Path,
    level: str,
    as_json: bool,
    nodes: tuple[str, ...],
    out_dir: Path | None,
    verbose: bool,
) -> None:
    """Run the checks of LEVEL on this node, in suite order."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        stream=sys.stderr,
        format=f"{PROG}: %(message)s",
    )
    suite = load_suite(suite_path)
    result = run_suite(suite, level, list(nodes) or None)
    if out_dir is not None:
        _write_result(out_dir, result)
    click.echo(result.model_dump_json(indent=2) if as_json else _table(result))
    raise click.exceptions.Exit(result.exit_code)


def main(args: list[str] | None = None) -> None:
    """Entry point; every error is one line and exit status 2."""
    try:
        # without standalone mode click returns the status a command exits with
        status = deepcheck.main(args=args, prog_name=PROG, standalone_mode=False)
    except click.UsageError as exc:
        click.echo(f"{PROG}: error: {exc.format_message()} (see --help)", err=True)
        sys.exit(EXIT_USAGE)
    except (click.ClickException, HyperpodError) as exc:
        message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        click.echo(f"{PROG}: error: {message}", err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        click.echo(f"{PROG}: interrupted", err=True)
        sys.exit(130)
    sys.exit(status if isinstance(status, int) else 0)
