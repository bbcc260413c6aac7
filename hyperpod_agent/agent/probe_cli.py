"""``hyperpod probe list|run``: the probes, once, in the foreground.

``probe run`` exits 0 when every probe is OK or WARN, 1 when one FAILs, 2 when none
fails but one is UNKNOWN (the node-problem-detector convention).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

_config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="agent.toml (default /etc/hyperpod/agent.toml if it exists)",
)


def _load(config_path: Path | None):  # type: ignore[no-untyped-def]
    from hyperpod_agent.agent.config import DEFAULT_CONFIG_PATH, load_agent_config

    if config_path is None and DEFAULT_CONFIG_PATH.exists():
        config_path = DEFAULT_CONFIG_PATH
    return load_agent_config(config_path)


@click.group()
def probe() -> None:
    """Inspect and run health probes."""


@probe.command("list")
@_config_option
def list_probes(config_path: Path | None) -> None:
    """Every probe, whether it is enabled, its interval and timeout."""
    from hyperpod_agent.probes.registry import PROBES

    config = _load(config_path)
    enabled = config.enabled_probes()
    click.echo(f"{'PROBE':<10} {'ENABLED':<8} {'INTERVAL':>9} {'TIMEOUT':>8}")
    for name in PROBES:
        cfg = getattr(config.probes, name)
        click.echo(
            f"{name:<10} {'yes' if name in enabled else 'no':<8} "
            f"{cfg.interval_s:>8g}s {cfg.timeout_s:>7g}s"
        )


@probe.command("run")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
@_config_option
def run_probes(name: str | None, as_json: bool, config_path: Path | None) -> None:
    """Run NAME (or every enabled probe) once and print what it found."""
    from hyperpod_agent.agent.daemon import build_probes
    from hyperpod_agent.health import Status
    from hyperpod_agent.probes.registry import PROBES
    from hyperpod_agent.probes.runner import ProbeRunner

    config = _load(config_path)
    if name is not None and name not in PROBES:
        raise click.BadParameter(
            f"no probe {name!r}; known: {', '.join(PROBES)}", param_hint="NAME"
        )
    if name is not None:
        # Running one probe by name runs it even if agent.toml disables it.
        cfg = getattr(config.probes, name).model_copy(update={"enabled": True})
        config = config.model_copy(update={"probes": config.probes.model_copy(update={name: cfg})})
    probes = build_probes(config)
    if name is not None:
        # the baseline probe is left out of the agent when there is no baseline
        probes = {name: probes.get(name) or PROBES[name](cfg, config.probe_context())}
    runner = ProbeRunner(probes)
    try:
        results = runner.run_once()
    finally:
        runner.close()
    results.sort(key=lambda r: list(probes).index(r.probe))
    if as_json:
        click.echo(json.dumps([r.model_dump(mode="json") for r in results], indent=1))
    else:
        for r in results:
            click.echo(f"{r.probe:<8} {r.status.value:<8} {r.duration_s * 1000:7.1f}ms {r.message}")
            for f in r.findings:
                urgent = " urgent" if f.urgent else ""
                click.echo(
                    f"  {f.component} {f.code} {f.status.value} "
                    f"{f.action.value}{urgent}: {f.message}"
                )
    statuses = {r.status for r in results}
    sys.exit(1 if Status.FAIL in statuses else 2 if Status.UNKNOWN in statuses else 0)
