"""Stopping a local cluster: exactly what it started, never a fake reboot half done,
and a look from outside afterwards (localcluster/leftovers.py) for what is left."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from hyperpod_agent.localcluster import leftovers, namespaces, procs

log = logging.getLogger(__name__)


def owned_pids(run: Path) -> dict[str, int]:
    """Every daemon whose pid file is in ``run`` and that is still alive, by name."""
    found: dict[str, int] = {}
    for pidfile in sorted(run.glob("*.pid")) if run.exists() else []:
        name = pidfile.stem
        kind = "slurmd" if name.startswith("slurmd-") else name
        pid = procs.read_pidfile(pidfile, None if kind.startswith("proc-") else kind)
        if pid is not None:
            found[name] = pid
    return found


def stop_daemons(run: Path) -> None:
    """Stop exactly what we started: extra processes, slurmctld, slurmd, what lives on
    in the nodes' namespaces, then munged."""
    pids = owned_pids(run)
    procs.stop([p for n, p in pids.items() if n.startswith("proc-")])
    procs.stop([p for n, p in pids.items() if n == "slurmctld"])
    procs.stop([p for n, p in pids.items() if n.startswith("slurmd-")])
    for _ in range(3):
        left = [p for p in namespaces.node_pids(run) if p != os.getpid()]
        if not left:
            break
        procs.stop(left, timeout=1)
    procs.stop([p for n, p in pids.items() if n == "munged"])
    namespaces.unpin_all(run)
    for pidfile in run.glob("*.pid") if run.exists() else []:
        pidfile.unlink(missing_ok=True)


def hold_reboots(
    stack: contextlib.ExitStack[bool | None],
    run: Path,
    names: Iterable[str],
    timeout: float = 30.0,
) -> None:
    """Wait (bounded) for the fake reboots under way and keep new ones out while the
    daemons stop: a reboot that began before ``down`` finishes first, so the slurmd it
    starts is among those stopped."""
    deadline = time.monotonic() + timeout
    for name in names if run.is_dir() else []:
        lock = stack.enter_context(open(run / f"reboot-{name}.lock", "w"))
        if not lock_within(lock, deadline):
            log.warning("%s: a reboot still holds the node; stopping anyway", name)


def settled_leftovers(root: Path, netns_prefix: str, settle_s: float = 5.0) -> list[str]:
    """What is left of the cluster once it had ``settle_s`` to go: a process on its way
    out (the reboot command that just let go) may name the directory for a moment."""
    deadline = time.monotonic() + settle_s
    while (left := leftovers.leftovers(root, netns_prefix)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def lock_within(lock: IO[str], deadline: float) -> bool:
    """Take ``lock`` (flock, exclusive) before ``deadline`` (monotonic); False if not."""
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
