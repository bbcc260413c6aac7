"""Host probes against real faults: a link in a network namespace goes down, a tmpfs
fills up and turns read-only, a FUSE mount stops answering, a slurmd dies.

Every wait is bounded and every namespace, mount and process made here is removed in
``finally``. Needs root and the kernel's fuse module (/dev/fuse); no extra packages.
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.health import ProbeResult, Status
from hyperpod_agent.probes.base import Outcome, ProbeContext
from hyperpod_agent.probes.cpu import CpuConfig, CpuProbe
from hyperpod_agent.probes.disk import DiskConfig, DiskProbe
from hyperpod_agent.probes.runner import ProbeRunner
from hyperpod_agent.probes.slurmd import SlurmdConfig, SlurmdProbe

CMD_TIMEOUT = 10


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, timeout=CMD_TIMEOUT, capture_output=True)


def codes(out: Outcome) -> list[str]:
    return [f.code for f in out.findings]


# --- (1) a link goes down inside a network namespace ---------------------------------------

# Runs inside `ip netns exec`, which mounts a /sys showing the namespace's interfaces.
NIC_LOOP = """
import json, sys, time
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.nic import NicConfig, NicProbe
iface, interval, duration = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
probe = NicProbe(NicConfig(interfaces=[iface]), ProbeContext(node_name="netns"))
end = time.monotonic() + duration
while time.monotonic() < end:
    start = time.monotonic()
    out = probe.check()
    codes = [f.code for f in out.findings]
    print(json.dumps({"start": start, "status": out.status.value, "codes": codes}), flush=True)
    time.sleep(interval)
"""
CYCLE_S = 0.3


class ProbeLines:
    """Reads the JSON lines of the in-namespace probe loop, each wait bounded."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.sel = selectors.DefaultSelector()
        self.sel.register(proc.stdout, selectors.EVENT_READ)

    def next(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        if not self.sel.select(timeout):
            raise AssertionError(f"no probe result within {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"probe loop exited: rc={self.proc.poll()}")
        result: dict[str, Any] = json.loads(line)
        return result

    def after(self, moment: float, count: int, timeout: float) -> list[dict[str, Any]]:
        """The first ``count`` results of runs that started after ``moment``."""
        deadline = time.monotonic() + timeout
        found: list[dict[str, Any]] = []
        while len(found) < count:
            line = self.next(max(0.1, deadline - time.monotonic()))
            if line["start"] > moment:
                found.append(line)
        return found


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"hp-test-{os.getpid()}"
    run("ip", "netns", "add", name)
    try:
        run("ip", "-n", name, "link", "add", "hpv0", "type", "veth", "peer", "name", "hpv1")
        run("ip", "-n", name, "link", "set", "hpv0", "up")
        run("ip", "-n", name, "link", "set", "hpv1", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], timeout=CMD_TIMEOUT, check=False)


@pytest.mark.root
def test_link_down_fails_within_two_cycles_and_recovers(netns: str) -> None:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-c", NIC_LOOP, "hpv0", str(CYCLE_S), "60"],
        stdout=subprocess.PIPE,
    )
    try:
        lines = ProbeLines(proc)
        first = lines.next(timeout=30)  # interpreter start-up
        deadline = time.monotonic() + 10
        while first["status"] != "OK" and time.monotonic() < deadline:  # veth carrier settles
            first = lines.next(timeout=5)
        assert first["status"] == "OK", first

        moment = time.monotonic()
        run("ip", "-n", netns, "link", "set", "hpv1", "down")  # hpv0 loses its carrier
        down = lines.after(moment, 2, timeout=10)
        assert any(r["status"] == "FAIL" and "link_down" in r["codes"] for r in down), down

        moment = time.monotonic()
        run("ip", "-n", netns, "link", "set", "hpv1", "up")
        up = lines.after(moment, 2, timeout=10)
        assert up[-1]["status"] == "OK", up
    finally:
        proc.kill()
        proc.wait(timeout=CMD_TIMEOUT)
        assert proc.stdout is not None
        proc.stdout.close()


# --- (2) a tmpfs fills up, then turns read-only --------------------------------------------


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    run("mount", "-t", "tmpfs", "-o", "size=4m", "hp-test", str(mnt))
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], timeout=CMD_TIMEOUT, check=False)


def fill(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.write(b"\0" * size)
        f.flush()
        os.fsync(f.fileno())


@pytest.mark.root
def test_tmpfs_filling_warns_then_fails_then_readonly(tmpfs: Path) -> None:
    config = DiskConfig.model_validate(
        {"mounts": [{"path": str(tmpfs), "name": "small", "free_warn_pct": 20, "free_fail_pct": 5}]}
    )
    probe = DiskProbe(config, ProbeContext(node_name="node1"))
    assert probe.check().status is Status.OK

    fill(tmpfs / "ballast", 4 * 1024 * 1024 * 85 // 100)  # ~15% free
    warn = probe.check()
    assert (warn.status, codes(warn)) == (Status.WARN, ["fs_space_low"]), warn.message

    fill(tmpfs / "ballast", 4 * 1024 * 1024 * 98 // 100)  # ~2% free
    full = probe.check()
    assert (full.status, codes(full)) == (Status.FAIL, ["fs_full"]), full.message

    (tmpfs / "ballast").unlink()
    assert probe.check().status is Status.OK
    run("mount", "-o", "remount,ro", str(tmpfs))
    readonly = probe.check()
    assert (readonly.status, codes(readonly)) == (Status.FAIL, ["fs_readonly"])


# --- (3) a mount that stops answering ------------------------------------------------------


class HungFuse:
    """A FUSE mount whose server never answers: /dev/fuse is opened and mounted but
    never read, so every request on the mount waits. Closing the device aborts the
    connection (pending requests fail with ENOTCONN) and frees any stuck thread."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.fd: int | None = os.open("/dev/fuse", os.O_RDWR)
        libc = ctypes.CDLL(None, use_errno=True)
        options = f"fd={self.fd},rootmode=40000,user_id=0,group_id=0".encode()
        if libc.mount(b"hp-test", str(target).encode(), b"fuse.hptest", 0, options) != 0:
            err = ctypes.get_errno()
            self.close()
            raise OSError(err, f"mount fuse on {target}: {os.strerror(err)}")

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        subprocess.run(["umount", "-l", str(self.target)], timeout=CMD_TIMEOUT, check=False)


@pytest.fixture
def hung_mount(tmp_path: Path) -> Iterator[Path]:
    target = tmp_path / "hung"
    target.mkdir()
    fuse = HungFuse(target)
    try:
        yield target
    finally:
        fuse.close()


@pytest.mark.root
def test_hung_mount_fails_on_time_while_cpu_keeps_its_cadence(hung_mount: Path) -> None:
    ctx = ProbeContext(node_name="node1")
    disk = DiskProbe(
        DiskConfig.model_validate(
            {
                "mounts": [{"path": str(hung_mount), "name": "hung"}],
                "interval_s": 1.0,
                "timeout_s": 2.0,
                "io_timeout_s": 0.5,
                "latency_warn_s": 0.2,
            }
        ),
        ctx,
    )
    cpu = CpuProbe(CpuConfig(interval_s=0.25, timeout_s=2.0), ctx)
    runner = ProbeRunner({"disk": disk, "cpu": cpu})  # type: ignore[dict-item]
    results: list[ProbeResult] = []
    end = time.monotonic() + 3.5
    try:
        while time.monotonic() < end:
            results += runner.cycle(max_wait=0.05)
            time.sleep(0.02)
    finally:
        runner.close()
    disk_results = [r for r in results if r.probe == "disk"]
    cpu_results = [r for r in results if r.probe == "cpu"]
    assert len(disk_results) >= 3
    for res in disk_results:
        # the probe itself reports the hang, on time: never the runner's UNKNOWN timeout
        assert res.status is Status.FAIL, res
        assert [f.code for f in res.findings] == ["fs_hung"]
        assert res.duration_s < 2.0
    assert "still stuck" in disk_results[-1].message
    assert len(cpu_results) >= 6  # every 0.25 s for 3 s, despite the hung mount
    assert all(r.status is not Status.UNKNOWN for r in cpu_results)


@pytest.mark.root
def test_hung_mount_thread_is_released_when_the_mount_is_aborted(tmp_path: Path) -> None:
    target = tmp_path / "hung"
    target.mkdir()
    fuse = HungFuse(target)
    probe = DiskProbe(
        DiskConfig.model_validate(
            {
                "mounts": [{"path": str(target), "name": "hung"}],
                "io_timeout_s": 0.3,
                "latency_warn_s": 0.1,
            }
        ),
        ProbeContext(node_name="node1"),
    )
    try:
        assert codes(probe.check()) == ["fs_hung"]
        stuck = [t for t in threading.enumerate() if t.name == f"disk-io:{target}"]
        assert len(stuck) == 1
    finally:
        fuse.close()
    stuck[0].join(timeout=5)
    assert not stuck[0].is_alive()
    assert codes(probe.check()) == ["fs_missing"]  # lazily unmounted


# --- (4) a slurmd dies ---------------------------------------------------------------------


@pytest.mark.root
@pytest.mark.slurm
def test_slurmd_killed_and_frozen(local_cluster: Any) -> None:
    node = local_cluster.nodes[-1]
    probe = SlurmdProbe(
        SlurmdConfig(command_timeout_s=2.0),
        ProbeContext(node_name=node, slurm_conf=str(local_cluster.slurm_conf)),
    )
    healthy = probe.check()
    assert healthy.status is Status.OK, healthy.message
    assert probe.munge_socket() == str(local_cluster.munge_socket)

    other = SlurmdProbe(
        SlurmdConfig(munge=False),
        ProbeContext(node_name=local_cluster.nodes[0], slurm_conf=str(local_cluster.slurm_conf)),
    )
    assert other.check().status is Status.OK  # each node's probe reaches its own slurmd

    try:
        local_cluster.node_kill(node, "STOP")
        frozen = probe.check()
        assert codes(frozen) == ["slurmd_unresponsive"], frozen.message
        local_cluster.node_kill(node, "CONT")

        local_cluster.node_kill(node, "KILL")
        deadline = time.monotonic() + 5
        while local_cluster.slurmd_pid(node) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        dead = probe.check()
        assert dead.status is Status.FAIL
        assert codes(dead) == ["slurmd_down"], dead.message
    finally:
        pid = local_cluster.slurmd_pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGCONT)  # in case an assertion left it stopped
        else:
            local_cluster.node_start(node)
        local_cluster.wait_idle([node], timeout=30)
    assert probe.check().status is Status.OK
