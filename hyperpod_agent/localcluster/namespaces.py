"""Handles on namespaces, kept as bind mounts under the cluster's run/ directory.

A bind-mounted ``/proc/PID/ns/X`` keeps the namespace alive after its last process
exits. We pin the UTS namespace of every slurmd we start (``run/ns/<node>.<pid>.<start>``) so
its inode number, by which ``down`` finds leftover processes, can never be handed to
somebody else's new namespace; and the host's own UTS and time namespaces
(``run/host-uts``, ``run/host-time``), which a fake-rebooted node's RebootProgram
enters to restart the node from outside.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hyperpod_agent.errors import LocalClusterError
from hyperpod_agent.localcluster import procs


def is_mount(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def _bind(source: str, pin: Path, what: str) -> None:
    pin.parent.mkdir(parents=True, exist_ok=True)
    pin.touch()
    res = subprocess.run(
        ["mount", "--bind", source, str(pin)], capture_output=True, text=True, timeout=10
    )
    if res.returncode != 0:
        pin.unlink(missing_ok=True)
        raise LocalClusterError(f"cannot pin {what}: {res.stderr.strip()}")


def pin_host(run: Path) -> None:
    """Pin this machine's UTS and time namespaces as run/host-uts and run/host-time."""
    for kind in ("uts", "time"):
        pin = run / f"host-{kind}"
        if not is_mount(pin):
            _bind(f"/proc/self/ns/{kind}", pin, f"the host's {kind} namespace")


def pin_path(run: Path, name: str, pid: int, started: int | None) -> Path:
    """Where node ``name``'s slurmd ``pid``, started at ``started`` (clock ticks since
    boot), pins its namespace. The start time keeps the name unique when a later slurmd
    gets a reused pid while the earlier pin is still mounted."""
    return run / "ns" / f"{name}.{pid}.{started if started is not None else 0}"


def pin_node(run: Path, name: str, pid: int) -> None:
    """Pin the UTS namespace ``pid`` (node ``name``'s slurmd) lives in."""
    pin = pin_path(run, name, pid, procs.start_time(pid))
    _bind(f"/proc/{pid}/ns/uts", pin, f"{name}'s namespace")


def _pinned(run: Path) -> dict[Path, str]:
    nsdir = run / "ns"
    pins: dict[Path, str] = {}
    for pin in sorted(nsdir.iterdir()) if nsdir.is_dir() else []:
        try:
            pins[pin] = f"uts:[{pin.stat().st_ino}]"
        except OSError:
            continue
    host = {procs.uts_ns(1), procs.uts_ns(os.getpid())}
    return {pin: ns for pin, ns in pins.items() if ns not in host}


def node_pids(run: Path) -> list[int]:
    """Processes living in the pinned node namespaces (never the host's own)."""
    namespaces = {ns for pin, ns in _pinned(run).items() if is_mount(pin)}
    return procs.pids_in_namespaces(namespaces)


def unpin_all(run: Path) -> None:
    for pin in [*_pinned(run), run / "host-uts", run / "host-time"]:
        if is_mount(pin):
            subprocess.run(["umount", str(pin)], capture_output=True, timeout=10)
        pin.unlink(missing_ok=True)
