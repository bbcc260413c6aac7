"""A rolling upgrade, live: the previous release's daemons (v0.1.0) beside this
release's on one real local Slurm cluster (docs/upgrades.md).

The old release's code is ``git archive v0.1.0 hyperpod_agent`` (the tag, else its
commit), extracted once under /var/tmp and run with this venv's python and
``PYTHONPATH`` (releases.py); nothing is installed. Each old daemon reads its config as
this release writes it, with a key this release brought, cut down to the keys the old
release's own config model accepts (asked of that model by running the old code): the
old ``hyperpod config validate`` refuses it before (v0.1.0 refused unknown keys) and
accepts it after.

- Old agents on two nodes report to this controller: accepted (the controller's node
  view, no refusal in its log, no unknown field counted), ``hyperpod version`` names
  them 0.1.0, and a real XID 79 on one of them is acted on: the node taken out for a
  reboot, the fault and the reboot in the event log, the node back in service.
- This release's agents report to the old controller, started on the state this
  controller wrote (the store's schema did not change, so its database is read as it
  is): v0.1.0 refused unknown fields, and none is sent (test_wire.py keeps it so), so
  every report is accepted, and a real XID 79 on a node is acted on by the old
  controller. This controller, put back on the state the old one wrote, still shows
  that fault and its reboot.
- At the end every daemon is this release's again, and ``hyperpod local-cluster down``
  leaves no process, network namespace, mount or port behind.

Faults land on nodes drawn at random (seed printed; ``HYPERPOD_DRILL_SEED`` replays).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import releases
from drill_helpers import Dice, Drill, RealFault, samples, wait_for
from releases import Release

from hyperpod_agent import __version__
from hyperpod_agent.localcluster import daemons, procs
from hyperpod_agent.localcluster.cluster import LocalCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

UPGRADE_DIR = Path("/var/tmp/hyperpod-upgrade")
UPGRADE_PORT_BASE = 20017
PREVIOUS = "0.1.0"
REPORTING_S = 30.0  # a daemon swapped -> its reports accepted (agent cycle 1 s, beats 5 s)
# What the controller logs for each refused request (controller/api/rejections.py).
REFUSED = re.compile(r"refused (\S+) (\S+) from .*?: (\d{3}) (\S+):")
# A key of this release's in each config, at its default (docs/upgrades.md: the
# previous release refused unknown keys, so a config is cut down before it gets it).
NEW_KEYS: dict[str, tuple[str, str, str]] = {
    "agent": ("controller", "mode", "act"),
    "controller": ("policy", "mode", "act"),
}
AGENT_REFUSED = "controller refused the report"  # an agent's line for a 4xx (reporter.py)


@pytest.fixture(scope="module")
def previous() -> Release:
    commit = releases.resolve()
    if commit is None:
        pytest.skip(
            f"neither {releases.PREVIOUS_TAG} nor {releases.PREVIOUS_COMMIT} is in this "
            "clone (a shallow clone?): git fetch --tags to run the upgrade drill"
        )
    release = releases.checkout(commit)
    where, version = release.imported()
    assert where == release.root / "hyperpod_agent" / "__init__.py", where
    assert version == PREVIOUS, version
    return release


@pytest.fixture(scope="module")
def upgrade_cluster(previous: Release) -> Iterator[LocalCluster]:
    cluster = LocalCluster(UPGRADE_DIR, nodes=3, spares=1, port_base=UPGRADE_PORT_BASE)
    try:
        cluster.up(timeout=60, services=True)
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def drill(upgrade_cluster: LocalCluster, previous: Release) -> Iterator[Drill]:
    """A controller of this release on empty state, the cluster restored; afterwards
    every daemon of this release again and the cluster restored."""
    d = Drill(upgrade_cluster)
    d.fresh_controller()
    d.restore()
    yield d
    this_release_back(d, previous)
    d.restore()


# ---------------------------------------------------------------------- helpers
def runs_release(d: Drill, service: str, release: Release) -> bool:
    """Service ``service`` runs ``release``'s code (its config file names the commit)."""
    pid = d.services.pid(service)
    if pid is None:
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return False
    return any(release.commit[:9] in arg for arg in argv)


def this_release_back(d: Drill, previous: Release) -> None:
    """Every daemon this release's again: the old ones stopped and replaced."""
    if runs_release(d, "controller", previous):
        d.services.stop("controller")
    d.services.start_controller()
    for node in d.all_nodes:
        if runs_release(d, f"agent-{node}", previous):
            d.services.stop(f"agent-{node}")
        d.services.start_agent(node)


class LogTail:
    """A daemon's log from now on (a swapped daemon appends to the same file)."""

    def __init__(self, d: Drill, name: str) -> None:
        self.path = d.cluster.dir / "log" / f"{name}.log"
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def text(self) -> str:
        with open(self.path, errors="replace") as f:
            f.seek(self.offset)
            return f.read()

    def refusals(self) -> list[str]:
        """Each 4xx a controller logged since, as ``METHOD PATH STATUS CODE``."""
        return [
            " ".join(m.groups())
            for m in REFUSED.finditer(self.text())
            if m.group(3).startswith("4")
        ]


def agents_refused(tails: list[LogTail]) -> list[str]:
    """What the agents logged since of a controller refusing their reports."""
    return [
        f"{t.path.name}: {line}"
        for t in tails
        for line in t.text().splitlines()
        if AGENT_REFUSED in line
    ]


def _at(value: str | None) -> float:
    return datetime.fromisoformat(value).timestamp() if value else 0.0


def reporting_since(view: dict[str, Any], since: float) -> bool:
    """The node is healthy to the controller, which accepted a report or a heartbeat
    from its agent after ``since``."""
    heard = max(_at(view.get("last_report_at")), _at(view.get("last_heartbeat_at")))
    return view.get("verdict") == "healthy" and heard > since


def fitted(d: Drill, previous: Release, kind: str, name: str, config: dict[str, Any]) -> Path:
    """``config`` as this release writes it, with a key this release brought
    (``NEW_KEYS``): refused as it is by the previous release's ``config validate``
    (0.1.0 refused unknown keys), accepted once cut down to the keys that release's
    own model knows. The file it was written to."""
    section, key, value = NEW_KEYS[kind]
    config[section][key] = value
    path = releases.write_config(d.cluster, previous, name, config)
    with pytest.raises(AssertionError, match=key):
        previous.validate_file(kind, path)
    config, dropped = previous.fit_config(kind, config)
    assert dropped == [f"{section}.{key}"], dropped
    print(f"  {name}: {PREVIOUS} does not know {', '.join(dropped)}: left out")
    path = releases.write_config(d.cluster, previous, name, config)
    previous.validate_file(kind, path)
    return path


def old_agent(d: Drill, previous: Release, node: str) -> None:
    """``node``'s agent replaced by the previous release's, on its config cut down to
    the keys that release knows."""
    path = fitted(d, previous, "agent", f"agent-{node}", d.services.agent_config(node))
    releases.start_agent(d.cluster, previous, node, path)


def wait_reporting(d: Drill, nodes: list[str], since: float, release: str | None) -> None:
    """Every node of ``nodes`` is heard from healthy after ``since``, its agent named
    ``release`` by the controller (None: a controller that names none)."""
    wait_for(
        f"{', '.join(nodes)} reporting as {release}",
        lambda: all(
            reporting_since(view := d.controller_nodes().get(n, {}), since)
            and view.get("agent_version") == release
            for n in nodes
        ),
        timeout=REPORTING_S,
        step=0.5,
        detail=d.controller_nodes,
    )


def acted_on(d: Drill, victim: str) -> None:
    """A real XID 79 on ``victim`` handled as on any day (drill_helpers.RealFault): the
    node taken out for a reboot, the fault and the reboot in the event log, the node
    rebooted and back in service."""
    fault = RealFault(d, victim)
    fault.inject()
    try:
        fault.taken_out()
        fault.events()
        fault.back()
    finally:
        fault.stop()


def kinds_for(events: list[dict[str, Any]], node: str, cause: str) -> set[str]:
    return {str(e["kind"]) for e in events if e.get("node") == node and cause in e["cause"]}


# ---------------------------------------------------------------------- drills
def test_agents_one_release_older_report_to_this_controller(
    drill: Drill, previous: Release
) -> None:
    dice = Dice("old agents -> this controller")
    old_nodes = dice.nodes("v0.1.0 agents", drill.nodes, 2)
    victim = dice.node("XID 79", old_nodes)
    log = LogTail(drill, "controller")
    agent_logs = [LogTail(drill, f"agent-{n}") for n in drill.all_nodes]
    since = time.time()
    for node in old_nodes:
        old_agent(drill, previous, node)
    wait_reporting(drill, old_nodes, since, PREVIOUS)
    view = drill.controller_nodes()
    assert all(_at(view[n]["last_report_at"]) > since for n in old_nodes), view

    doc = drill.hyperpod_json("version")
    assert doc["controller"] == __version__, doc
    assert doc["agents"] == {
        n: PREVIOUS if n in old_nodes else __version__ for n in drill.all_nodes
    }
    assert doc["too_far"] == [], doc
    shown = drill.hyperpod("version").stdout
    assert f"{PREVIOUS}: 2 nodes ({', '.join(sorted(old_nodes))})" in shown, shown

    acted_on(drill, victim)
    # Nothing lost: the event log still holds the fault and the reboot asked for it.
    assert {"fault", "reboot"} <= kinds_for(drill.events(), victim, "xid79")
    # The local cluster's fake reboot starts the agent the harness knows, this
    # release's; a real node boots the package it has installed: put the old one back.
    assert not runs_release(drill, f"agent-{victim}", previous)
    since = time.time()
    old_agent(drill, previous, victim)
    wait_reporting(drill, old_nodes, since - 60.0, PREVIOUS)
    wait_reporting(drill, [victim], since, PREVIOUS)

    assert log.refusals() == [], log.refusals()
    assert agents_refused(agent_logs) == []
    unknown = samples(drill.services.controller_url, "hyperpod_api_unknown_fields_total")
    assert not any(unknown.values()), unknown


def test_this_releases_agents_report_to_a_controller_one_release_older(
    drill: Drill, previous: Release
) -> None:
    dice = Dice("this release's agents -> old controller")
    victim = dice.node("XID 79", drill.nodes)
    config = drill.services.controller_config()
    path = fitted(drill, previous, "controller", "controller", config)
    log = LogTail(drill, "controller")
    agent_logs = [LogTail(drill, f"agent-{n}") for n in drill.all_nodes]
    since = time.time()
    releases.start_controller(drill.cluster, previous, path)
    # The agents keep running and send what they send any controller: a heartbeat
    # while nothing changes, a full report when something does (the fault below).
    wait_reporting(drill, drill.all_nodes, since, None)
    doc = drill.hyperpod_json("version")
    assert doc["controller"] is None, doc  # 0.1.0 does not say its release
    assert "older than 0.2.0" in drill.hyperpod("version").stdout

    acted_on(drill, victim)
    view = drill.controller_nodes()
    assert _at(view[victim]["last_report_at"]) > since, view  # full reports accepted
    assert log.refusals() == [], log.refusals()
    assert agents_refused(agent_logs) == []

    # This release's controller back on the state the old one wrote: nothing lost.
    drill.services.stop("controller")
    assert not runs_release(drill, "controller", previous)
    since = time.time()
    drill.services.start_controller()
    assert {"fault", "reboot"} <= kinds_for(drill.events(), victim, "xid79")
    wait_reporting(drill, drill.all_nodes, since, __version__)


def test_down_leaves_nothing_behind(upgrade_cluster: LocalCluster, previous: Release) -> None:
    d = Drill(upgrade_cluster)
    for service in ["controller", *(f"agent-{n}" for n in d.all_nodes)]:
        assert d.services.pid(service) is not None, service
        assert not runs_release(d, service, previous), service
    pids = list(upgrade_cluster.owned_pids().values())
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "hyperpod_agent",
            "local-cluster",
            "down",
            "--dir",
            str(UPGRADE_DIR),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=d.env,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert [p for p in pids if procs.alive(p)] == []
    assert upgrade_cluster.owned_pids() == {} and upgrade_cluster.namespace_pids() == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    assert f"hp{UPGRADE_PORT_BASE}-" not in netns.stdout, netns.stdout
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1] for line in f]
    assert [m for m in mounts if m.startswith(str(UPGRADE_DIR))] == []
    services = upgrade_cluster.services
    daemons.ports_free(
        [*upgrade_cluster.shape.ports, services.controller_port]
        + [services.metrics_port(n) for n in d.all_nodes]
    )
    assert not upgrade_cluster.shape.memory_root.exists()
