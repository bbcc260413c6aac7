"""The provisioned layout in use: a controller and a worker provisioned into prefixes
inside the local cluster's directory, then run from the files provisioning wrote. The
agent (fake GPUs) reports to the controller over MUNGE-authenticated HTTP, and the
controller reads the real local Slurm.

Needs root and the local cluster (``local_cluster`` fixture). Every wait is bounded;
the processes started here are stopped by pid in ``finally``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.client import ControllerClient
from hyperpod_agent.provision.apply import apply_plan
from hyperpod_agent.provision.load import parse_parameters
from hyperpod_agent.provision.plan import Options, build_plan

REPO = Path(__file__).resolve().parents[2]
PROC_TIMEOUT_S = 15


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=PROC_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=PROC_TIMEOUT_S)


@pytest.fixture
def root(local_cluster: Any) -> Iterator[Path]:
    """A provisioning prefix area under the cluster directory, removed afterwards."""
    path = Path(local_cluster.dir) / f"provision-test-{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def source(root: Path) -> Path:
    """The repository's systemd units and SPANK plugin sources, built here, not in the tree."""
    src = root / "src"
    shutil.copytree(REPO / "systemd", src / "systemd")
    shutil.copytree(
        REPO / "spank_plugin", src / "spank_plugin", ignore=shutil.ignore_patterns("*.so", "*.o")
    )
    return src


def parameters(cluster: Any, root: Path, port: int) -> dict[str, Any]:
    scenario = root / "gpus.json"
    scenario.write_text(json.dumps({"generate": 8}))
    munge = {"mode": "munge", "munge_socket": str(cluster.munge_socket)}
    off = {"enabled": False}
    return {
        "cluster_name": "hyperpod-local",
        "controller": {"nodes": ["head"]},
        "worker_groups": [
            {
                "name": "compute",
                "nodes": [*cluster.nodes, *cluster.spares],
                "partitions": ["main"],
                "gpus": 8,
            }
        ],
        "partitions": [{"name": "main", "default": True}],
        "spare_pool": {"nodes": list(cluster.spares), "partition": "main"},
        "controller_url": f"http://127.0.0.1:{port}",
        "agent_overrides": {
            "metrics": {"enabled": False},
            "slurm_conf": str(cluster.slurm_conf),
            "probes": {
                "gpu": {"backend": "fake", "fake_scenario": str(scenario), "kmsg_path": ""},
                "nic": off,
                "disk": off,
                "cpu": off,
                "slurmd": off,
                "script": off,
            },
            "controller": {
                "auth": munge,
                "heartbeat_interval_s": 2,
                "slurm_conf": str(cluster.slurm_conf),
            },
        },
        "controller_overrides": {
            "slurm_conf": str(cluster.slurm_conf),
            "auth": munge,
            # Watch, never act: other tests share this cluster.
            "policy": {"dry_run": True},
        },
    }


def provision(params: dict[str, Any], node: str, prefix: Path, source: Path, verify: bool) -> Any:
    plan = build_plan(
        parse_parameters(params, "provisioning_parameters.json"),
        node,
        Options(prefix=prefix, source=source, skip_install=True, verify_timeout_s=30),
    )
    return apply_plan(plan, verify=verify)


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "hyperpod_agent", *argv],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_for_report(
    client: ControllerClient, node: str, since: datetime, timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = client.request("GET", "/v1/nodes")
        except Exception as exc:  # noqa: BLE001 - the controller may still be starting
            last = repr(exc)
        else:
            for entry in last:
                stamp = entry.get("last_report_at")
                if entry["name"] == node and stamp and datetime.fromisoformat(stamp) >= since:
                    return dict(entry)
        time.sleep(0.5)
    raise AssertionError(f"no report from {node} within {timeout}s; last answer: {last}")


@pytest.mark.slurm
def test_provisioned_agent_reports_to_provisioned_controller(
    local_cluster: Any, root: Path, source: Path
) -> None:
    port = free_port()
    params = parameters(local_cluster, root, port)
    head, worker = root / "head", root / "node1"
    # The controller's slurm.conf gets our include line: give it a copy, never the live
    # one. The copy's plugstack file is Slurm's default, next to it (provisioning
    # refuses a PlugStackConfig elsewhere: its line there would never load).
    (head / "etc/slurm").mkdir(parents=True)
    site = local_cluster.slurm_conf.read_text()
    site = "\n".join(x for x in site.splitlines() if not x.startswith("PlugStackConfig="))
    (head / "etc/slurm/slurm.conf").write_text(site + "\n")

    first = provision(params, "head", head, source, verify=False)
    assert str(first.plan.role) == "controller (group controller)"
    assert (head / "opt/hyperpod/lib/auto_resume.so").stat().st_size > 0
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            spawn(
                ["controller", "run", "--config", str(head / "etc/hyperpod/controller.toml")],
                local_cluster.env,
                root / "controller.log",
            )
        )
        # The controller check of a second run waits for /v1/healthz; nothing else changes.
        again = provision(params, "head", head, source, verify=True)
        assert again.changed == []
        assert again.checks[0][1] == f"http://127.0.0.1:{port}/v1/healthz: HTTP 200"

        # A worker: one agent cycle from the provisioned agent.toml is the verification.
        result = provision(params, "node1", worker, source, verify=True)
        assert str(result.plan.role) == "worker (group compute)"
        assert result.checks[0][1].startswith("node1: healthy")

        since = datetime.now(UTC)
        procs.append(
            spawn(
                ["agent", "run", "--config", str(worker / "etc/hyperpod/agent.toml")],
                local_cluster.env,
                root / "agent.log",
            )
        )
        client = ControllerClient(
            f"http://127.0.0.1:{port}",
            ClientAuth(AuthConfig(mode="munge", munge_socket=local_cluster.munge_socket)),
        )
        entry = wait_for_report(client, "node1", since, timeout=60)
        assert entry["verdict"] == "healthy", entry
        assert (worker / "run/hyperpod/health.json").exists()
    except AssertionError:
        for name in ("controller.log", "agent.log"):
            log = root / name
            if log.exists():
                print(f"--- {name}\n{log.read_text()[-4000:]}")
        raise
    finally:
        for proc in procs:
            stop(proc)
