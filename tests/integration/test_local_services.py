"""The local cluster with its hyperpod services: up, agents reporting, a clean down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyperpod_agent.localcluster import drill, procs
from hyperpod_agent.localcluster.cluster import LocalCluster

pytestmark = pytest.mark.slurm


def _netns() -> list[str]:
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mounts") as f:
        return [ln.split()[1] for ln in f if ln.split()[1].startswith(str(path))]


WRITTEN = "# Written by `hyperpod provision`"


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def assert_provisioned_by_the_lifecycle_script(cluster: LocalCluster) -> None:
    """Every service runs on the file its node's on_create.sh wrote from the cluster's
    provisioning_parameters.json: the first head's in DIR, each other node's in
    DIR/nodes/<node>; the daemons read the include and plugstack it wrote."""
    d = cluster.dir
    services = cluster.services
    assert json.loads((d / "etc" / "provisioning_parameters.json").read_text())
    running = {
        "controller": (services.controller_config_path(), d / "etc/hyperpod/controller.toml")
    }
    for node in cluster.shape.all_names:
        wrote = d / "nodes" / node / "etc/hyperpod/agent.toml"
        running[f"agent-{node}"] = (services.agent_config_path(node), wrote)
    for name, (path, wrote) in running.items():
        pid = services.pid(name)
        assert pid is not None, name
        assert str(path) in cmdline(pid), (name, cmdline(pid))
        assert path.resolve() == wrote, (name, path.resolve())
        assert wrote.read_text().startswith(WRITTEN), wrote
    for conf in ("hyperpod.conf", "plugstack.conf"):
        assert (
            WRITTEN in (d / "etc" / conf).read_text()
            or "BEGIN hyperpod" in (d / "etc" / conf).read_text()
        ), conf
    assert "include" in (d / "etc" / "slurm.conf").read_text()


def test_services_come_up_report_and_go_away_completely(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", nodes=2, spares=0, port_base=20417)
    try:
        cluster.up(timeout=60, services=True)
        env = {**os.environ, "HYPERPOD_LOCAL_CLUSTER_DIR": str(cluster.dir)}

        def healthy() -> bool:
            res = subprocess.run(
                [sys.executable, "-m", "hyperpod_agent", "nodes", "--json"],
                capture_output=True,
                text=True,
                env=env,
                timeout=30,
            )
            if res.returncode != 0:
                return False
            nodes = json.loads(res.stdout)
            return sorted(n["name"] for n in nodes if n.get("verdict") == "healthy") == [
                "node1",
                "node2",
            ]

        drill.wait_for("both agents to report healthy over MUNGE", 60, healthy, interval=0.5)
        assert_provisioned_by_the_lifecycle_script(cluster)
        pids = list(cluster.owned_pids().values())
        assert any(n.startswith("proc-agent-") for n in cluster.owned_pids())
        assert "proc-controller" in cluster.owned_pids()
        assert {cluster.services.netns(n) for n in cluster.nodes} <= set(_netns())
    finally:
        cluster.down()
    assert all(not procs.alive(p) for p in pids)
    assert not set(_netns()) & {cluster.services.netns(n) for n in cluster.nodes}
    assert _mounts_under(cluster.dir) == []
