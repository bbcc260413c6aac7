"""Process bookkeeping for the local cluster: only ever touch what we started.

A pid file holds ``<pid> <start time>``; a pid counts as ours only when the process
still has that start time (so a recycled pid is never killed) and runs the binary we
expect. Processes left in the UTS namespaces our slurmd were started in (orphaned
slurmstepd and job tasks) are swept by namespace, never the host's own namespace.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")


def start_time(pid: int) -> int | None:
    """Process start time in clock ticks since boot, or None if it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def _shifted_boot_time() -> bool:
    """True inside a time namespace with a boot-time offset (a fake-rebooted node):
    /proc start times read there are shifted (and may wrap), so they cannot be
    compared with the ones recorded on the host."""
    try:
        for line in (PROC / "self" / "timens_offsets").read_text().splitlines():
            fields = line.split()
            if fields and fields[0] == "boottime" and fields[1:2] != ["0"]:
                return True
    except OSError:
        pass
    return False


def alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (a zombie child of ours is reaped)."""
    _reap(pid)
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("State:"):
            return "Z" not in line.split()[1]
    return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: its parent (or init) reaps it


def exe(pid: int) -> str:
    try:
        return os.readlink(PROC / str(pid) / "exe")
    except OSError:
        return ""


def write_pidfile(path: Path, pid: int) -> None:
    st = start_time(pid)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{pid} {st}\n")
    os.replace(tmp, path)


def read_pidfile(path: Path, exe_name: str | None = None) -> int | None:
    """The pid recorded in ``path`` if that very process still runs (and runs a
    binary whose resolved name starts with ``exe_name``); None otherwise."""
    try:
        parts = path.read_text().split()
        pid, recorded = int(parts[0]), int(parts[1]) if len(parts) > 1 else None
    except (OSError, ValueError, IndexError):
        return None
    if not alive(pid):
        return None
    if recorded is not None and start_time(pid) != recorded and not _shifted_boot_time():
        return None
    if exe_name and not os.path.basename(exe(pid)).startswith(exe_name):
        return None
    return pid


def stop(pids: Iterable[int], timeout: float = 10.0) -> None:
    """TERM all at once, wait up to ``timeout``, KILL what is left."""
    pids = [p for p in pids if alive(p)]
    for p in pids:
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if alive(p):
            _signal(p, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def uts_ns(pid: int) -> str | None:
    try:
        return os.readlink(PROC / str(pid) / "ns" / "uts")
    except OSError:
        return None


def pids_in_namespaces(namespaces: set[str]) -> list[int]:
    """Every live process whose UTS namespace is one of ``namespaces``. The host's
    own namespace is never in the set (``remember_ns`` refuses it)."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            if uts_ns(pid) in namespaces and alive(pid):
                found.append(pid)
    return found


def wait_for_new_uts_ns(pid: int, timeout: float = 5.0) -> str | None:
    """``unshare`` has a pid before it has unshared: wait until the child's UTS
    namespace differs from ours and return it."""
    host = uts_ns(os.getpid())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ns = uts_ns(pid)
        if ns is None:
            return None
        if ns != host:
            return ns
        time.sleep(0.01)
    return None


def rss_kb(pid: int) -> int:
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0
