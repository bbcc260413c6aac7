"""What a stopped local cluster must not leave behind, looked for from outside.

``down`` stops what its pid files and pinned namespaces name; this looks again without
them: any process whose command line or environment names the cluster's directory (a
slurmd a late reboot started, a job task with the cluster's SLURM_CONF), any mount under
the directory, any network namespace of the cluster's nodes. A test or a drill that
inherits another's daemons fails in ways that point nowhere near the cause.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

PROC = Path("/proc")


def _ancestors() -> set[int]:
    """This process and its parents: the command that asked names the directory too."""
    found: set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            stat = (PROC / str(pid) / "stat").read_text()
            pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def _names(blob: bytes, root: str) -> bool:
    return any(
        arg == root or arg.startswith(root + "/") or ("=" + root + "/") in arg
        for arg in blob.decode(errors="replace").split("\0")
    )


def processes(root: Path) -> list[str]:
    """Live processes naming ``root`` in their command line or environment."""
    text = str(root.resolve())
    mine = _ancestors()
    found: list[str] = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        if _names(cmdline, text) or _names(environ, text):
            argv = cmdline.decode(errors="replace").replace("\0", " ").strip()
            found.append(f"process {entry.name}: {argv[:160] or '?'}")
    return sorted(found)


def mounts(root: Path) -> list[str]:
    """Mount points at or under ``root`` (/proc/self/mountinfo, octal escapes read)."""
    text = str(root.resolve())
    found: list[str] = []
    for line in (PROC / "self" / "mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = fields[4].encode().decode("unicode_escape")
        if point == text or point.startswith(text + "/"):
            found.append(f"mount {point}")
    return found


def network_namespaces(prefix: str) -> list[str]:
    """Named network namespaces (``ip netns``) starting with ``prefix``."""
    try:
        res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    names = [line.split()[0] for line in res.stdout.splitlines() if line.strip()]
    return [f"network namespace {n}" for n in names if n.startswith(prefix)]


def leftovers(root: Path, netns_prefix: str) -> list[str]:
    """Everything of the cluster in ``root`` still present, one line each."""
    return [*processes(root), *mounts(root), *network_namespaces(netns_prefix)]
