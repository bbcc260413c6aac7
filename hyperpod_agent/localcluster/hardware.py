"""A fake node's hardware on this machine: a small tmpfs scratch mount (fill it, remount
it read-only) and a network namespace with a data link (set its far end down), whose
sysfs view is mounted where the node's agent reads it, so the agent sees the node's own
interface."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hyperpod_agent.errors import LocalClusterError
from hyperpod_agent.localcluster.namespaces import is_mount

DATA_LINK = "data0"
PEER = "peer0"  # the far end of the cable: set down, the node's link loses carrier


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if check and res.returncode != 0:
        raise LocalClusterError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


def make(sysdir: Path, scratch: Path, ns: str) -> None:
    """The scratch mount, namespace ``ns`` with its link up, and its sysfs at ``sysdir``
    (each kept when already there)."""
    scratch.mkdir(parents=True, exist_ok=True)
    if not is_mount(scratch):
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m", "hyperpod-scratch", str(scratch)],
            check=True,
            capture_output=True,
            timeout=10,
        )
    if _ip("netns", "list", check=False).stdout.split().count(ns) == 0:
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "add", DATA_LINK, "type", "veth", "peer", "name", PEER)
    for link in (DATA_LINK, PEER, "lo"):
        _ip("-n", ns, "link", "set", link, "up")
    sysdir.mkdir(parents=True, exist_ok=True)
    if not is_mount(sysdir):
        # sysfs shows the network namespace of whoever mounts it. `ip netns exec`
        # switches to a private mount namespace; nsenter takes the mount back to ours
        # so the agent sees it.
        mount = ["mount", "-t", "sysfs", "sysfs", str(sysdir)]
        subprocess.run(
            ["ip", "netns", "exec", ns, "nsenter", f"--mount=/proc/{os.getpid()}/ns/mnt", *mount],
            check=True,
            capture_output=True,
            timeout=10,
        )


def remove(sysdir: Path, scratch: Path, ns: str) -> None:
    for path in (sysdir, scratch):
        if is_mount(path):
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=10)
    _ip("netns", "delete", ns, check=False)


def set_link(ns: str, up: bool) -> None:
    _ip("-n", ns, "link", "set", PEER, "up" if up else "down")
