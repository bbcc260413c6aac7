"""``hyperpod controller run``: the controller daemon (API + reconcile loop)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

import click

from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.command import run_command
from hyperpod_agent.controller.config import DEFAULT_PATH, ControllerConfig, load_config
from hyperpod_agent.controller.gate import Gate
from hyperpod_agent.controller.leadership import Leadership
from hyperpod_agent.controller.providers import make_provider
from hyperpod_agent.controller.service import Controller
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.errors import ConfigError
from hyperpod_agent.sdnotify import sd_notify

log = logging.getLogger(__name__)


def check_watchdog(config: ControllerConfig, environ: Mapping[str, str]) -> None:
    """Refuse a provider command allowed to run as long as systemd's watchdog: a pass
    stuck in it that long is a hung controller, whatever keeps the watchdog fed."""
    usec = environ.get("WATCHDOG_USEC", "")
    if not usec.isascii() or not usec.isdigit() or config.provider.kind == "spare_pool":
        return
    watchdog_s = int(usec) / 1e6
    if config.provider.command_timeout_s >= watchdog_s:
        raise ConfigError(
            f"provider.command_timeout_s ({config.provider.command_timeout_s:g} s) must be "
            f"below the service's WatchdogSec ({watchdog_s:g} s)"
        )


def build(config: ControllerConfig, config_path: Path | None) -> Controller:
    """Wire store, Slurm client and provider into a Controller."""
    from hyperpod_agent.slurm.client import SlurmClient

    check_watchdog(config, os.environ)
    # Claim the state before migrating it: a second controller must change nothing.
    # With [ha] several controllers share it and the leader lease says which one acts.
    store = Store(config.store_location(), migrate=False)
    try:
        if not config.ha.enabled:
            store.claim()
        store.migrate()
    except BaseException:
        store.close()
        raise
    leadership = None
    if config.ha.enabled:
        ha = config.ha
        leadership = Leadership(store, config.controller_id(), ha.lease_ttl_s, ha.renew_every_s)
    # The providers and every runner change Slurm only through this gate.
    gate = Gate(
        SlurmClient(config.slurm_conf, timeout=config.slurm_timeout_s),
        slurm_users=(config.slurm_user,),
        store=store,
        leadership=leadership,
        margin_s=config.ha.clock_margin_s,
    )
    return Controller(
        config,
        store,
        gate,
        make_provider(config.provider, gate),
        config_path,
        leadership=leadership,
    )


def serve(controller: Controller) -> None:
    """Run the loop in a thread and the API in this one until SIGTERM/SIGINT."""
    from hyperpod_agent.controller.api.app import create_app
    from hyperpod_agent.controller.api.server import make_server

    config = controller.config

    def node_address(name: str) -> str | None:
        # munge mode checks that a node's claim comes from the node's own address
        node = controller.nodes.get(name)
        return node.address or None if node else None

    app = create_app(controller, ServerAuth(config.auth, node_address=node_address))
    # Bind before the loop starts: a second instance must fail before it touches Slurm.
    try:
        sock = socket.create_server((config.listen_host, config.listen_port), backlog=2048)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {config.listen_host}:{config.listen_port}: {exc.strerror}"
        ) from exc
    stop = threading.Event()
    loop = threading.Thread(
        target=controller.run,
        args=(stop, lambda: sd_notify("WATCHDOG=1")),
        name="reconcile",
        daemon=True,
    )
    server = make_server(app, config.listen_host, config.listen_port)
    # uvicorn stops on SIGTERM/SIGINT and then raises the signal again under the handler
    # it found: with the default one the process would die there, before the cleanup
    # below (the loop stopped, the leader lease released, the store closed).
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stopped)
    if controller.leadership is not None:
        controller.leadership.start()
    loop.start()
    sd_notify("READY=1")
    log.info(
        "controller %s listening on %s:%d (auth %s, mode %s, %s)",
        config.controller_id(),
        config.listen_host,
        config.listen_port,
        config.auth.mode,
        "observe" if config.policy.observe else "act",
        "high availability" if controller.leadership is not None else "single",
    )
    try:
        server.run(sockets=[sock])
    finally:
        sd_notify("STOPPING=1")
        stop.set()
        controller.wake.set()
        loop.join(timeout=30)
        if controller.leadership is not None:
            # Only once the loop stopped acting: a standby takes over at once.
            controller.leadership.stop(release=not loop.is_alive())
        controller.store.close()


def _stopped(signum: int, frame: object) -> None:
    log.info("controller stopping on signal %d", signum)


_config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=None,
    help=f"Controller config (TOML). [default: {DEFAULT_PATH} if present]",
)


@click.group("controller")
def controller() -> None:
    """The controller: the only component that changes Slurm state."""


@controller.command("run")
@_config_option
def run(config_path: Path | None) -> None:
    """Serve the API and run the reconcile loop until stopped."""
    config = load_config(config_path)
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    serve(
        build(
            config,
            config_path
            if config_path is not None
            else (DEFAULT_PATH if DEFAULT_PATH.exists() else None),
        )
    )


@controller.command("migrate")
@_config_option
def migrate(config_path: Path | None) -> None:
    """Upgrade the state store's schema (SQLite or PostgreSQL) to this version's."""
    location = load_config(config_path).store_location()
    store = Store(location, migrate=False)
    try:
        before = store.schema_version()
        after = store.migrate()
    finally:
        store.close()
    click.echo(f"{location.url}: schema version {before} -> {after}")


def main() -> None:
    """``python -m hyperpod_agent.controller.cli``: the same as ``hyperpod controller``."""
    run_command(controller, sys.argv[1:], prog_name="hyperpod controller")


if __name__ == "__main__":
    main()
