"""``hyperpod health-check``: Slurm's HealthCheckProgram and prolog read the cache.

It runs no probe and imports nothing heavy (no pydantic, no prometheus): only the
standard library, click, and the cache reader. Exit status, one line of reason:

  0  healthy (also degraded, unless ``degraded_fails``; also stale with ``on_stale=warn``)
  1  the node is faulty (or degraded with ``degraded_fails``)
  2  the cache is stale: the agent has not written it for ``stale_after_s``
  3  the cache is missing, unreadable or malformed: the agent is not running
  4  the health-check settings (agent.toml) could not be read
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from hyperpod_agent.agent.cache import DEFAULT_CACHE_PATH, read_cache_dict

DEFAULT_CONFIG_PATH = Path("/etc/hyperpod/agent.toml")

EXIT_OK, EXIT_FAULTY, EXIT_STALE, EXIT_NO_CACHE, EXIT_CONFIG = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class CheckSettings:
    """What health-check needs from agent.toml (read without validation models)."""

    cache_path: Path = DEFAULT_CACHE_PATH
    stale_after_s: float = 60.0
    on_stale: str = "fail"
    degraded_fails: bool = False


class SettingsError(Exception):
    """agent.toml could not give us the settings."""


def read_settings(path: Path) -> CheckSettings:
    """The health-check settings from agent.toml (the agent validates the rest)."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: {exc}") from None
    hc = data.get("health_check", {})
    try:
        settings = CheckSettings(
            cache_path=Path(data.get("cache_path", DEFAULT_CACHE_PATH)),
            stale_after_s=float(hc.get("stale_after_s", 60.0)),
            on_stale=str(hc.get("on_stale", "fail")),
            degraded_fails=bool(hc.get("degraded_fails", False)),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise SettingsError(f"{path}: health_check: {exc}") from None
    if settings.on_stale not in ("fail", "warn"):
        raise SettingsError(f"{path}: health_check.on_stale: expected fail or warn")
    return settings


def judge(data: dict[str, Any], now: datetime, settings: CheckSettings) -> tuple[int, str]:
    """Exit status and one-line reason for a cache's content (pure)."""
    node = str(data.get("node", "?"))
    try:
        generated = datetime.fromisoformat(str(data["generated_at"]))
        verdict = str(data["verdict"])
    except (KeyError, ValueError):
        return EXIT_NO_CACHE, "cache malformed: no generated_at/verdict"
    if generated.tzinfo is None:
        generated = generated.replace(tzinfo=UTC)
    age = (now - generated).total_seconds()
    message = str(data.get("message", ""))
    action = str(data.get("action", "NONE"))
    if abs(age) > settings.stale_after_s:
        # A cache from the future (clock stepped back) would otherwise never go stale.
        when = f"{age:.0f}s ago" if age > 0 else f"{-age:.0f}s in the future"
        line = (
            f"{node}: cache stale: written {when} (limit "
            f"{settings.stale_after_s:g}s); is hyperpod-agent running?"
        )
        if settings.on_stale == "fail":
            return EXIT_STALE, line
        prefix = "warning: "
    else:
        prefix = ""
    if verdict == "faulty":
        urgent = " urgent" if data.get("urgent") else ""
        return EXIT_FAULTY, f"{node}: faulty (action {action}{urgent}): {message}"
    if verdict == "degraded":
        code = EXIT_FAULTY if settings.degraded_fails else EXIT_OK
        return code, f"{prefix}{node}: degraded: {message}"
    if verdict == "healthy":
        if prefix:
            return EXIT_OK, (
                f"warning: {node}: healthy but cache stale ({age:.0f}s old, limit "
                f"{settings.stale_after_s:g}s)"
            )
        return EXIT_OK, f"{node}: healthy"
    return EXIT_NO_CACHE, f"cache malformed: unknown verdict {verdict!r}"


def run_check(settings: CheckSettings, now: datetime | None = None) -> tuple[int, str]:
    """Read the cache and judge it."""
    try:
        data = read_cache_dict(settings.cache_path)
    except FileNotFoundError:
        return EXIT_NO_CACHE, (
            f"no health cache at {settings.cache_path}: hyperpod-agent has not run on this node"
        )
    except (OSError, ValueError) as exc:
        return EXIT_NO_CACHE, f"cannot read health cache {settings.cache_path}: {exc}"
    return judge(data, now or datetime.now(UTC), settings)


@click.command("health-check")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="agent.toml (default /etc/hyperpod/agent.toml if it exists)",
)
@click.option(
    "--cache",
    "cache_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="health cache (overrides agent.toml)",
)
@click.option("--stale-after", type=float, default=None, help="seconds (overrides agent.toml)")
@click.option("--on-stale", type=click.Choice(["fail", "warn"]), default=None)
@click.option("--degraded-fails", is_flag=True, default=None, help="exit 1 on a degraded node too")
@click.option(
    "--prolog",
    is_flag=True,
    help="as Slurm's Prolog: exit 1 only on a fresh, urgent fault, after draining the node "
    "with hyperpod's reason; exit 0 in every other case (docs/agent.md)",
)
def health_check(
    config_path: Path | None,
    cache_path: Path | None,
    stale_after: float | None,
    on_stale: str | None,
    degraded_fails: bool | None,
    prolog: bool,
) -> None:
    """Judge this node from the agent's health cache (for HealthCheckProgram/prolog)."""
    settings = CheckSettings()
    if config_path is None and DEFAULT_CONFIG_PATH.exists():
        config_path = DEFAULT_CONFIG_PATH
    if config_path is not None:
        try:
            settings = read_settings(config_path)
        except SettingsError as exc:
            if prolog:  # a node without agent.toml runs no agent: nothing to judge
                click.echo(f"hyperpod health-check: {exc} (the job may start)")
                sys.exit(EXIT_OK)
            click.echo(f"hyperpod health-check: {exc}", err=True)
            sys.exit(EXIT_CONFIG)
    settings = CheckSettings(
        cache_path=cache_path or settings.cache_path,
        stale_after_s=stale_after if stale_after is not None else settings.stale_after_s,
        on_stale=on_stale or settings.on_stale,
        degraded_fails=settings.degraded_fails if degraded_fails is None else degraded_fails,
    )
    if prolog:
        code, line = prolog_check(settings, config_path)
    else:
        code, line = run_check(settings)
    click.echo(f"hyperpod health-check: {line}", err=code != EXIT_OK)
    sys.exit(code)


def prolog_check(settings: CheckSettings, config_path: Path | None) -> tuple[int, str]:
    """The Prolog's answer: only a fresh cache may refuse a job (a stale one says
    nothing about now), and only an urgent fault does (agent/prolog.py)."""
    from hyperpod_agent.agent import prolog

    fresh = CheckSettings(settings.cache_path, settings.stale_after_s, "fail", False)
    code, line = run_check(fresh)
    if code != EXIT_FAULTY:
        return EXIT_OK, f"{line} (the job may start)"
    try:
        cache = read_cache_dict(fresh.cache_path)
    except (OSError, ValueError) as exc:  # rewritten or removed since: say so, let it start
        return EXIT_OK, f"cannot read health cache {fresh.cache_path}: {exc} (the job may start)"
    return prolog.gate(cache, prolog.read_gate_settings(config_path))
