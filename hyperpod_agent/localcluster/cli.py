"""``hyperpod local-cluster``: a real multi-node Slurm on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import click

from hyperpod_agent.errors import LocalClusterError
from hyperpod_agent.localcluster import procs
from hyperpod_agent.localcluster.cluster import DEFAULT_DIR, DEFAULT_PORT_BASE, LocalCluster

dir_option = click.option(
    "--dir",
    "dir_",
    type=click.Path(path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    help="Directory holding the cluster's config, state, logs and sockets.",
)


def _load(dir_: Path) -> LocalCluster:
    return LocalCluster.load(dir_)


@click.group("local-cluster")
def local_cluster() -> None:
    """Run a real multi-node Slurm cluster (munged, slurmctld, slurmd per node) here."""


@local_cluster.command()
@click.option("--nodes", type=int, default=4, show_default=True, help="Nodes in service.")
@click.option(
    "--spares",
    type=int,
    default=1,
    show_default=True,
    help="Spare nodes: running, drained with reason hyperpod:spare.",
)
@dir_option
@click.option(
    "--port-base",
    type=int,
    default=DEFAULT_PORT_BASE,
    show_default=True,
    help="slurmctld port; node K listens on port-base + 10 + K.",
)
@click.option("--slurmd-timeout", type=click.IntRange(1, 600), default=6, show_default=True)
@click.option("--message-timeout", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option(
    "--cred-expire",
    type=click.IntRange(5, 600),
    default=5,
    show_default=True,
    help="Seconds a requeued job waits before it may start again, minus one.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(1, 600),
    default=60,
    show_default=True,
    help="Seconds to wait for the nodes to become idle.",
)
@click.option(
    "--with-services",
    is_flag=True,
    help="Also start the controller and an agent per node (fake GPUs).",
)
@click.option(
    "--ha",
    is_flag=True,
    help="With --with-services: a PostgreSQL store and two controllers, one leading.",
)
def up(
    nodes: int,
    spares: int,
    dir_: Path,
    port_base: int,
    slurmd_timeout: int,
    message_timeout: int,
    cred_expire: int,
    timeout: float,
    with_services: bool,
    ha: bool,
) -> None:
    """Start the cluster and wait until every in-service node is idle."""
    if nodes < 1:
        raise click.BadParameter("must be at least 1", param_hint="--nodes")
    if spares < 0:
        raise click.BadParameter("must be 0 or more", param_hint="--spares")
    if ha and not with_services:
        raise click.BadParameter(
            "needs --with-services (it is about the controllers)", param_hint="--ha"
        )
    cluster = LocalCluster(
        dir_,
        nodes,
        spares,
        port_base,
        slurmd_timeout=slurmd_timeout,
        message_timeout=message_timeout,
        cred_expire=cred_expire,
        ha=ha,
    )
    started = cluster.up(timeout=timeout, services=with_services)
    what = "started" if started else "already running"
    click.echo(
        f"local cluster {what}: {','.join(cluster.nodes)} in service, "
        f"spares: {','.join(cluster.spares) or 'none'}",
        err=True,
    )
    if cluster.has_services():
        services = cluster.services
        for name in services.controllers:
            click.echo(f"{name}: {services.url_of(name)}", err=True)
    click.echo(f"export SLURM_CONF={cluster.slurm_conf}")


@local_cluster.command()
@dir_option
def down(dir_: Path) -> None:
    """Cancel every job and stop every process the cluster started."""
    try:
        cluster = _load(dir_)
    except LocalClusterError:
        click.echo(f"no local cluster in {dir_}: nothing to stop", err=True)
        return
    left = cluster.down()
    if left:
        lines = "\n".join(f"  {line}" for line in left)
        raise click.ClickException(f"local cluster in {cluster.dir} stopped, but left:\n{lines}")
    click.echo(f"local cluster in {cluster.dir} stopped", err=True)


@local_cluster.command()
@dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(dir_: Path, as_json: bool) -> None:
    """Daemons with pid and memory, and the nodes' Slurm states."""
    cluster = _load(dir_)
    daemons = {
        name: {"pid": pid, "rss_kb": procs.rss_kb(pid)}
        for name, pid in cluster.owned_pids().items()
    }
    states = cluster.node_states() if cluster.running() else {}
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dir": str(cluster.dir),
                    "running": cluster.running(),
                    "daemons": daemons,
                    "nodes": states,
                },
                indent=2,
            )
        )
        return
    click.echo(f"local cluster in {cluster.dir}: {'up' if cluster.running() else 'down'}")
    for name, info in daemons.items():
        click.echo(f"  {name:<22} pid {info['pid']:<8} rss {info['rss_kb']:>7} kB")
    for node, state in states.items():
        click.echo(f"  {node:<10} {state}")


@local_cluster.command()
@dir_option
def env(dir_: Path) -> None:
    """Print what to export to use the cluster's Slurm commands."""
    click.echo(f"export SLURM_CONF={_load(dir_).slurm_conf}")


@local_cluster.command("node-kill")
@click.argument("node")
@click.option("--signal", "sig", default="KILL", show_default=True)
@dir_option
def node_kill(node: str, sig: str, dir_: Path) -> None:
    """Signal NODE's slurmd (simulates a node failure)."""
    pid = _load(dir_).node_kill(node, sig)
    click.echo(f"{node}: sent SIG{sig.upper().removeprefix('SIG')} to slurmd {pid}", err=True)


@local_cluster.command("node-crash")
@click.argument("node")
@dir_option
def node_crash(node: str, dir_: Path) -> None:
    """Kill NODE's slurmd and every process on it (a machine failure)."""
    pids = _load(dir_).node_crash(node)
    click.echo(f"{node}: killed {len(pids)} process(es)", err=True)


@local_cluster.command("node-start")
@click.argument("node")
@dir_option
def node_start(node: str, dir_: Path) -> None:
    """(Re)start NODE's slurmd."""
    pid = _load(dir_).node_start(node)
    click.echo(f"{node}: slurmd pid {pid}", err=True)


@local_cluster.command("node-reboot")
@click.argument("node")
@dir_option
def node_reboot(node: str, dir_: Path) -> None:
    """Fake a reboot of NODE: restart its slurmd with a fresh boot time."""
    pid = _load(dir_).node_reboot(node)
    click.echo(f"{node}: rebooted, slurmd pid {pid}", err=True)
