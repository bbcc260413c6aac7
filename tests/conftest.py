"""Shared fixtures.

``local_cluster`` starts a real Slurm cluster (munged, slurmctld, 4 slurmd + 1 spare)
under /var/tmp/hyperpod-test once per test session and always stops it. Set
HYPERPOD_TEST_CLUSTER_DIR to a directory where ``hyperpod local-cluster up`` already
runs a cluster to reuse it (it is then left running).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

TEST_CLUSTER_DIR = Path("/var/tmp/hyperpod-test")
TEST_PORT_BASE = 17817


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The drills on the service cluster are one lane of scripts/test.sh, which runs
    # them beside the rest (-m services / -m "not services").
    for item in items:
        if "service_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.services)
    # Integration tests need root (namespaces, daemons as root); say so instead of failing.
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root")
    for item in items:
        if "slurm" in item.keywords or "root" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A drill that fails on a cluster reports what the cluster looked like then: CI
    keeps nothing else (the cluster directory goes with the machine)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    args = getattr(item, "funcargs", {})
    for name in ("service_cluster", "local_cluster"):
        if name in args:
            report.sections.append((f"{name} when the test failed", cluster_story(args[name])))


def cluster_story(cluster: object) -> str:
    """Slurm's view (sinfo, squeue) and the controller's log tail; never raises."""
    parts: list[str] = []
    env = {**os.environ, **getattr(cluster, "env", {})}
    for cmd in (["sinfo", "-N", "-h", "-o", "%N %T %E"], ["squeue", "-h", "-o", "%i %T %R %N"]):
        try:
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=10)
            parts.append(f"$ {' '.join(cmd)}\n{res.stdout}{res.stderr}")
        except (OSError, subprocess.SubprocessError) as exc:
            parts.append(f"$ {' '.join(cmd)}: {exc}")
    log = Path(getattr(cluster, "dir", "/nonexistent")) / "log" / "controller.log"
    try:
        tail = log.read_text(errors="replace").splitlines()[-80:]
        parts.append(f"{log} (last {len(tail)} lines)\n" + "\n".join(tail))
    except OSError as exc:
        parts.append(f"{log}: {exc}")
    return "\n".join(parts)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[object]:
    from hyperpod_agent.localcluster.cluster import LocalCluster

    reuse = os.environ.get("HYPERPOD_TEST_CLUSTER_DIR")
    if reuse:
        yield LocalCluster.load(Path(reuse))
        return
    cluster = LocalCluster(TEST_CLUSTER_DIR, nodes=4, spares=1, port_base=TEST_PORT_BASE)
    try:
        cluster.up(timeout=60)
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory every user can reach (pytest's own tmp_path is private to root), for
    tests that run code as another user."""
    d = Path(tempfile.mkdtemp(prefix="hp-shared-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


SERVICE_CLUSTER_DIR = Path("/var/tmp/hyperpod-svc")
SERVICE_PORT_BASE = 18017


@pytest.fixture(scope="session")
def service_cluster() -> Iterator[object]:
    """A second local cluster with the hyperpod services: the controller (MUNGE
    authentication on) and an agent per node with fake GPUs, tmpfs scratch mounts and
    per-node network namespaces, for fault drills and auto-resume stories."""
    from hyperpod_agent.localcluster.cluster import LocalCluster

    reuse = os.environ.get("HYPERPOD_TEST_SERVICE_CLUSTER_DIR")
    if reuse:
        yield LocalCluster.load(Path(reuse))
        return
    cluster = LocalCluster(SERVICE_CLUSTER_DIR, nodes=4, spares=1, port_base=SERVICE_PORT_BASE)
    try:
        cluster.up(timeout=60, services=True)
        yield cluster
    finally:
        cluster.down()
