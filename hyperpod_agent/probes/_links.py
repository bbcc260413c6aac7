"""What the nic probe knows about a link's history within this boot: whether the kernel
saw a netdev's carrier come up, and the links the probe itself saw up, kept across
agent restarts. Only a link that was up since boot can be down (probes/nic.py)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from hyperpod_agent.probes._sysfs import read_text, under

log = logging.getLogger(__name__)

# <state_dir>/SEEN_UP_FILE: the links the nic probe saw up during the current boot
SEEN_UP_FILE = "nic-links-up.json"


def netdev_was_up(carrier_up_count: int | None, carrier_changes: int | None) -> bool:
    """Did the kernel see this netdev's carrier come up since it was registered (boot,
    or the driver's load)? Without ``carrier_up_count`` (kernels before 4.16) two
    carrier changes are needed: drivers turn the carrier off once when they start."""
    if carrier_up_count is not None:
        return carrier_up_count > 0
    return (carrier_changes or 0) >= 2


def read_boot_id(procfs_root: Path) -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), None when unreadable."""
    try:
        return read_text(under(procfs_root, "/sys/kernel/random/boot_id"))
    except OSError:
        return None


class SeenUp:
    """The links seen up during this boot, kept in ``<state_dir>/SEEN_UP_FILE`` so a
    restarted agent still knows a port that was up and went down. The file names its
    boot; a file from another boot counts for nothing. Failing to keep it costs only
    the memory across restarts (the kernel's counters remain), so it is logged once."""

    def __init__(self, state_dir: Path | None, boot_id: str | None) -> None:
        self.path = state_dir / SEEN_UP_FILE if state_dir is not None else None
        self.boot_id = boot_id
        self._names = self._load()
        self._save_failed = False

    def _load(self) -> set[str]:
        if self.path is None:
            return set()
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("boot_id") == self.boot_id:
                return {str(name) for name in data["up"]}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            pass  # absent (first start of this boot) or unusable: start afresh
        return set()

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def add(self, name: str) -> None:
        if name in self._names:
            return
        self._names.add(name)
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps({"boot_id": self.boot_id, "up": sorted(self._names)}))
            os.replace(tmp, self.path)
            self._save_failed = False
        except OSError as exc:
            if not self._save_failed:
                log.warning("nic probe: couldn't keep the links seen up in %s: %s", self.path, exc)
            self._save_failed = True
