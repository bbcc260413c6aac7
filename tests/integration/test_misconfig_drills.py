"""Misconfiguration is not a node fault, on the real local cluster with the controller
acting: an uncabled port, an agent whose node name is not Slurm's, the agent under the
shipped unit's sandbox (docs/probes.md, "Misconfiguration is not a node fault").

Each is made on a node drawn at random (the seed printed; ``HYPERPOD_DRILL_SEED``
replays it) the way a site makes it (misconfig_helpers.py), and judged on Slurm
(``sinfo``, ``scontrol``, slurmctld's log: the node never left service, no reboot was
asked for it), on the controller's events (no take-out, one finding, opened once) and
on its view of the node. The drill watches a number of the probe's runs and of the
controller's passes, not a time. Then a real fault of the same kind on the same node
(the port that was up goes down, the allowed scratch mount turns read-only) is still
taken out: the rules spare configurations, not faults.

One cluster for the module, a controller on empty state for every drill.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drill_helpers import (
    REBOOT_S,
    Dice,
    Drill,
    back_in_service,
    metric,
    new_events,
    passes,
    wait_for,
)
from misconfig_helpers import (
    SHIPPED_UNIT,
    RocePort,
    UnitSandbox,
    mount_table,
    mount_tmpfs,
    probe_in_namespace_of,
    restore_agent_config,
    start_agent_on_host,
    start_sandboxed_agent,
    unmount,
    write_agent_config,
)

from hyperpod_agent.localcluster.cluster import LocalCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

MISCONFIG_DIR = Path("/var/tmp/hyperpod-misconfig")
MISCONFIG_PORT_BASE = 20217
NO_GATES = {"gate_reentry": False, "gate_spares": False}
TAKE_OUT = frozenset({"drain", "hold", "reboot", "replace"})
SEEN_S = 40.0  # a misconfiguration or a fault made -> seen by the controller
# Runs of the probe watched once its finding is in: past the agent's start-up grace
# (5 s) and fail_after_runs (2) at the local cluster's 1 s (nic, disk) and 2 s (slurmd)
# intervals, had the finding been a FAIL.
RUNS = {"nic": 8, "disk": 8, "slurmd": 5}
PASSES = 3  # the controller's passes after that, each of which could have acted


@pytest.fixture(scope="module")
def misconfig_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster(MISCONFIG_DIR, nodes=3, spares=1, port_base=MISCONFIG_PORT_BASE)
    try:
        cluster.up(timeout=60, services=True)
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def d(misconfig_cluster: LocalCluster) -> Iterator[Drill]:
    """A controller on empty state, acting, and the cluster restored; afterwards every
    agent.toml as the cluster writes it, and the same again."""
    d = Drill(misconfig_cluster)
    d.fresh_controller(deep_checks=NO_GATES)
    d.restore()
    assert d.status()["mode"] == "act", d.status()
    yield d
    for node in d.all_nodes:
        restore_agent_config(d.services, node)
    d.fresh_controller(deep_checks=NO_GATES)
    d.restore(timeout=120)


class Window:
    """What happens to ``nodes`` from now on: the controller's events, slurmctld's log."""

    def __init__(self, d: Drill, *nodes: str) -> None:
        self.d = d
        self.nodes = nodes
        self.since = d.last_event_id()
        self.ctld = d.cluster.dir / "log" / "slurmctld.log"
        self.offset = self.ctld.stat().st_size

    def events(self, node: str) -> list[dict[str, Any]]:
        return new_events(self.d, self.since, node)

    def faults(self, node: str) -> list[str]:
        """The causes of the faults the controller opened for ``node``, in order."""
        return [e["cause"] for e in self.events(node) if e["kind"] == "fault"]

    def slurm_changes(self) -> list[str]:
        """slurmctld's lines about a change of state or reason of one of the nodes, or
        a reboot asked for it."""
        text = self.ctld.read_bytes()[self.offset :].decode(errors="replace")
        return [
            line
            for line in text.splitlines()
            for node in self.nodes
            if f"update_node: node {node} " in line
            or (f"reboot request queued for nodes {node}" in line)
        ]

    def left_in_service(self, node: str) -> None:
        """``node`` never left service: Slurm shows it idle without a reason or a reboot
        flag, slurmctld changed nothing of it, and the controller took it out never."""
        state = sinfo(self.d, node)
        assert state == ("idle", ""), (state, self.d.describe())
        assert back_in_service(self.d.node(node)), self.d.describe()
        assert self.slurm_changes() == [], self.slurm_changes()
        taken = [e for e in self.events(node) if e["kind"] in TAKE_OUT]
        assert taken == [], taken


def sinfo(d: Drill, node: str) -> tuple[str, str]:
    """(state, reason) of ``node`` as ``sinfo`` shows them."""
    res = subprocess.run(
        ["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"],
        env=d.env,
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    state, _, reason = res.stdout.strip().splitlines()[0].partition("|")
    return state, "" if reason == "none" else reason


def view(d: Drill, node: str) -> dict[str, Any]:
    """The controller's view of ``node`` (``hyperpod node show``)."""
    shown: dict[str, Any] = d.hyperpod_json("node", "show", node)
    return shown


def result(shown: dict[str, Any], probe: str) -> dict[str, Any]:
    """``probe``'s result in the last report the controller has from the node."""
    report = shown.get("report") or {}
    for res in report.get("results", []):
        if res["probe"] == probe:
            found: dict[str, Any] = res
            return found
    return {}


def cached(d: Drill, node: str, probe: str) -> dict[str, Any]:
    """``probe``'s latest result in ``node``'s health cache, which its agent rewrites
    every cycle (the controller gets a report only when a status or finding changes)."""
    try:
        report = json.loads(d.services.cache(node).read_text())
    except (OSError, ValueError):
        return {}
    return result({"report": report}, probe)


def open_faults(shown: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((f["component"], f["code"]) for f in shown["faults"] if not f["closed_at"])


def watched(d: Drill, node: str, probe: str) -> None:
    """Waits, without a clock, for ``RUNS[probe]`` more runs of the probe on ``node``'s
    agent and then ``PASSES`` more passes of the controller."""
    agent = f"http://127.0.0.1:{d.services.metrics_port(node)}"

    def runs() -> float:
        return metric(agent, "hyperpod_probe_duration_seconds_count", f'probe="{probe}"')

    first = runs()
    wait_for(f"{RUNS[probe]} runs of the {probe} probe on {node}",
             lambda: runs() >= first + RUNS[probe], 10.0 * RUNS[probe], 0.5)  # fmt: skip
    url = d.services.controller_url
    before = passes(url).get("ok", 0)
    wait_for(f"{PASSES} passes of the controller",
             lambda: passes(url).get("ok", 0) >= before + PASSES, 30.0, 0.5)  # fmt: skip


def taken_out_for(d: Drill, node: str, cause: str) -> None:
    """Waits until the controller took ``node`` out for a reboot over ``cause``."""
    reason = f"hyperpod:reboot {cause}"
    wait_for(f"{node} taken out for {cause}",
             lambda: d.node(node).reason.startswith(reason), SEEN_S, 0.2,
             detail=d.describe)  # fmt: skip


def rebooted_back(d: Drill, node: str, slurmd_before: int | None) -> None:
    """Waits until ``node`` was rebooted (a new slurmd) and is back in service."""
    wait_for(f"{node} rebooted and back in service",
             lambda: (back_in_service(d.node(node))
                      and d.cluster.slurmd_pid(node) not in (None, slurmd_before)),
             REBOOT_S, 0.5, detail=d.describe_reboots)  # fmt: skip


def log_lines(path: Path, start: int, text: str) -> list[str]:
    return [ln for ln in path.read_bytes()[start:].decode(errors="replace").splitlines()
            if text in ln]  # fmt: skip


# --- 1. a second port nobody cabled --------------------------------------------------


def test_a_port_never_up_since_boot_is_left_alone_until_it_was_up(d: Drill) -> None:
    """A second RoCE port without a cable, on a node whose agent.toml expects its HCA:
    the node stays in service with the port named in the nic probe's OK message and no
    finding. Cabled, seen up and pulled again, the same port is ``link_down``: taken
    out for a reboot, as docs/probes.md says of a link that was up and went down."""
    dice = Dice("uncabled port")
    node = dice.node("node with an uncabled second port", d.nodes)
    port = RocePort(d.services, node, d.cluster.dir / "misconfig" / node / "sys")
    port.remove()  # what an interrupted run left
    try:
        port.install()
        assert port.netdev_attr("carrier_up_count") == 0  # the kernel never saw it up
        config = d.services.agent_config(node)
        config["sysfs_root"] = str(port.root)
        config["probes"]["nic"]["ib_devices"] = [port.device]  # the HCA must be there
        window = Window(d, node)
        write_agent_config(d.services, node, config)
        d.restart_agent(node)
        idle = f"1 never up since boot ({port.component})"
        wait_for(f"{node}'s agent naming {port.component} never up",
                 lambda: idle in cached(d, node, "nic").get("message", ""),
                 SEEN_S, 0.5, detail=lambda: cached(d, node, "nic"))  # fmt: skip
        watched(d, node, "nic")
        nic = cached(d, node, "nic")
        assert nic["status"] == "OK" and nic["findings"] == [], nic
        assert idle in nic["message"], nic
        shown = view(d, node)
        assert result(shown, "nic").get("status") == "OK", shown["report"]
        assert shown["verdict"] == "healthy" and open_faults(shown) == [], shown
        assert window.faults(node) == [], window.events(node)
        window.left_in_service(node)

        # The cable comes: the port is up and checked from then on ...
        port.cable(True)
        wait_for(f"{node}'s agent seeing {port.component} up",
                 lambda: "1 IB/EFA port(s) ok" in cached(d, node, "nic").get("message", ""),
                 SEEN_S, 0.5, detail=lambda: cached(d, node, "nic"))  # fmt: skip
        assert port.netdev_attr("carrier_up_count") == 1
        # ... and going down after it was up is a fault like any other link's.
        slurmd = d.cluster.slurmd_pid(node)
        port.cable(False)
        taken_out_for(d, node, f"{port.component} link_down")
        restore_agent_config(d.services, node)  # the rebooted node's agent
        causes = window.faults(node)
        assert causes.count(f"{port.component} link_down") == 1, window.events(node)
        kinds = {e["kind"] for e in window.events(node)}
        assert "reboot" in kinds, window.events(node)
        rebooted_back(d, node, slurmd)
    finally:
        restore_agent_config(d.services, node)
        d.restart_agent(node)
        port.remove()


# --- 2. the agent's node name is not Slurm's -----------------------------------------


def test_an_agent_named_after_its_host_not_its_nodename_is_one_configuration_finding(
    d: Drill,
) -> None:
    """Slurm calls the node ``nodeN``, its host is ``ip-10-0-0-N`` and agent.toml leaves
    ``node_name`` at its default, the host name. The agent reports under the host name
    with one ``config_node_name`` finding, opened once and logged once; Slurm's node is
    never drained or rebooted, and nothing is asked of Slurm for either name."""
    dice = Dice("node name mismatch")
    node = dice.node("node whose agent runs under its host name", d.nodes)
    host = f"ip-10-0-0-{node.removeprefix('node')}"
    config = d.services.agent_config(node)
    del config["node_name"]  # the default: the host name
    log = d.cluster.dir / "log" / f"agent-{node}.log"
    try:
        window = Window(d, node, host)
        write_agent_config(d.services, node, config)
        start = log.stat().st_size
        start_agent_on_host(d.services, node, host)
        cause = "slurmd config_node_name"

        def reported() -> bool:
            return host in d.controller_nodes() and ("slurmd", "config_node_name") in open_faults(
                view(d, host)
            )

        wait_for(f"the controller to hold {cause} for {host}", reported, SEEN_S, 0.5,
                 detail=d.controller_nodes)  # fmt: skip
        watched(d, node, "slurmd")
        shown = view(d, host)
        (fault,) = [f for f in shown["faults"] if f["code"] == "config_node_name"]
        assert fault["closed_at"] is None and fault["severity"] == "WARN", fault
        assert fault["action"] == "MONITOR" and not fault["urgent"], fault
        assert repr(host) in fault["message"] and "NodeName" in fault["message"], fault
        assert open_faults(shown) == [("slurmd", "config_node_name")], shown["faults"]
        assert shown["verdict"] == "degraded", shown
        assert window.faults(host) == [cause], window.events(host)
        assert [e for e in window.events(host) if e["kind"] in TAKE_OUT] == []
        assert len(log_lines(log, start, "slurmd probe: configuration error")) == 1
        window.left_in_service(node)
        # Slurm never heard of the host name: nothing was done to a node under it.
        res = subprocess.run(["scontrol", "show", "node", host], env=d.env,
                             capture_output=True, text=True, timeout=20)  # fmt: skip
        assert res.returncode != 0, res.stdout
    finally:
        restore_agent_config(d.services, node)
        d.restart_agent(node)


# --- 3. the shipped unit's sandbox ---------------------------------------------------


def test_the_units_sandbox_is_configuration_and_a_read_only_scratch_still_a_fault(
    d: Drill,
) -> None:
    """The agent runs as the shipped unit sandboxes it, with the drop-in docs/probes.md
    shows (``ReadWritePaths=/scratch``), and is told to write-probe a shared mount the
    unit does not open: one ``config_write_denied``, the node in service, the scratch
    mount written. A real read-only remount of the scratch mount is then
    ``fs_readonly`` and the node taken out: the probe still works in the sandbox."""
    dice = Dice("sandboxed agent")
    node = dice.node("node whose agent runs in the unit's sandbox", d.nodes)
    scratch = d.services.scratch(node)
    shared = d.cluster.dir / "misconfig" / node / "shared"
    dropin = "[Service]\nReadWritePaths=/scratch\n"  # systemctl edit hyperpod-agent
    sandbox = UnitSandbox.of(SHIPPED_UNIT.read_text(), dropin)
    assert sandbox.runtime_directories == ("/run/hyperpod",), sandbox
    writable = sandbox.writable(
        {"/run/hyperpod": d.services.cache(node).parent, "/scratch": scratch}
    )
    assert writable == [d.services.cache(node).parent, scratch], writable
    unmount(shared)  # what an interrupted run left
    mount_tmpfs(shared, "hyperpod-shared")
    try:
        config = d.services.agent_config(node)
        config["probes"]["disk"]["mounts"].append(
            {"path": str(shared), "name": "shared", "write_probe": True}
        )
        window = Window(d, node)
        write_agent_config(d.services, node, config)
        pid = start_sandboxed_agent(d.services, node, writable)

        def sandboxed() -> bool:
            """The sandbox made whole: the shared mount read-only (the first thing it
            does) and the writable paths bound read-write again (the last)."""
            try:
                table = mount_table(pid)
            except OSError:
                return False
            rw = all(table.get(str(path), ("", True))[1] is False for path in writable)
            return table.get(str(shared)) == ("tmpfs", True) and rw

        wait_for(f"{node}'s agent in its sandbox", sandboxed, 20.0, 0.1)
        table = mount_table(pid)
        assert table["/"][1], table  # the cluster's directory read-only with it
        assert table[str(scratch)] == ("tmpfs", False), table
        assert table[str(d.services.cache(node).parent)][1] is False, table
        cause = "shared config_write_denied"
        wait_for(f"the controller to hold {cause} for {node}",
                 lambda: ("shared", "config_write_denied") in open_faults(view(d, node)),
                 SEEN_S, 0.5, detail=lambda: result(view(d, node), "disk"))  # fmt: skip
        watched(d, node, "disk")
        shown = view(d, node)
        assert open_faults(shown) == [("shared", "config_write_denied")], shown["faults"]
        (fault,) = [f for f in shown["faults"] if f["code"] == "config_write_denied"]
        assert fault["action"] == "MONITOR" and not fault["urgent"], fault
        assert f"ReadWritePaths={shared}" in fault["message"], fault
        # The probe writes the mount the drop-in opens, in the agent's own namespace.
        alone = probe_in_namespace_of(d.services, pid, "disk", d.services.agent_config(node))
        assert alone["status"] == "OK" and "(scratch write " in alone["message"], alone
        assert shown["verdict"] == "degraded", shown
        assert window.faults(node) == [cause], window.events(node)
        window.left_in_service(node)
        assert d.services.pid(f"agent-{node}") == pid  # the same sandboxed agent

        # A real fault on the mount the unit opens: read-only for everyone.
        slurmd = d.cluster.slurmd_pid(node)
        d.remount_scratch(node, read_only=True)
        taken_out_for(d, node, "scratch fs_readonly")
        restore_agent_config(d.services, node)  # the rebooted node's agent
        assert window.faults(node).count("scratch fs_readonly") == 1, window.events(node)
        assert "reboot" in {e["kind"] for e in window.events(node)}, window.events(node)
        rebooted_back(d, node, slurmd)
    finally:
        restore_agent_config(d.services, node)
        d.restart_agent(node)
        if d.scratch_read_only(node):
            d.remount_scratch(node, read_only=False)
        unmount(shared)  # the sandbox went with its agent
