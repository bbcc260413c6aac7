"""CPU priority of the checkpoint's background threads.

Training owns the CPU: the staging copy in the training thread, data loaders and kernel
launches must not wait for checkpoint I/O. On Linux every thread has its own nice value, so
the background writers lower only their own priority; among them the persistent tier (what
makes a save durable) ranks above the peer copy and the replica server.
"""

from __future__ import annotations

import os
import threading

DISK = 5  # persistent writer and checksums
NETWORK = 15  # peer copy, replica server


def lower_priority(nice: int) -> None:
    """Raise the calling thread's nice value to ``nice`` (never lowers it; best effort)."""
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (OSError, AttributeError):  # not Linux, or not allowed: run at the same priority
        pass
