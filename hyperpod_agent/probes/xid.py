"""NVIDIA XID codes: what each asks for, and a parser for the kernel's XID lines.

The default table follows DESIGN.md §9; ``gpu.xid_actions`` in agent.toml overrides
single entries. Reading the kernel log is separate from parsing it: ``parse_kmsg_line``
is pure and tested on literal lines, ``KmsgReader`` only does bounded, non-blocking I/O.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from hyperpod_agent.health import Action

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class XidRule:
    """What one XID asks for."""

    action: Action
    urgent: bool = False


def _rules(xids: tuple[int, ...], action: Action, urgent: bool = False) -> dict[int, XidRule]:
    return {x: XidRule(action, urgent) for x in xids}


DEFAULT_XID_RULES: dict[int, XidRule] = {
    # Application errors: a job's bug, not the GPU's; counted toward the lemon score.
    **_rules((13, 31, 43, 45, 68), Action.MONITOR),
    # Row-remap / ECC events that are harmless once; the controller resets on repeats.
    **_rules((63, 92, 94), Action.MONITOR),
    **_rules(
        (46, 62, 64, 74, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158),
        Action.RESET,
    ),
    # Double-bit ECC: uncorrectable memory errors are urgent (DESIGN.md §2).
    48: XidRule(Action.RESET, urgent=True),
    **_rules((79, 151, 168), Action.REBOOT, urgent=True),
    54: XidRule(Action.REPLACE),
    # 154 names its own recovery action; this is the fallback when it cannot be read.
    154: XidRule(Action.RESET),
}

# Unknown XIDs are recorded, never acted on: a new driver must not drain a fleet.
UNKNOWN_XID_RULE = XidRule(Action.MONITOR)

# XID 154's text: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)".
_RECOVERY_ACTIONS: dict[str, XidRule] = {
    "none": XidRule(Action.NONE),
    "gpu reset required": XidRule(Action.RESET),
    "node reboot required": XidRule(Action.REBOOT, urgent=True),
    "drain p2p": XidRule(Action.MONITOR),
    "drain and reset": XidRule(Action.RESET),
}
_RECOVERY_RE = re.compile(r"recovery action changed from .*? to \S+ \(([^)]*)\)", re.IGNORECASE)


def xid_rule(xid: int, message: str = "", overrides: dict[int, XidRule] | None = None) -> XidRule:
    """The rule for ``xid``: config override, else XID 154's named action, else the
    default table, else MONITOR."""
    if overrides and xid in overrides:
        return overrides[xid]
    if xid == 154:
        match = _RECOVERY_RE.search(message)
        if match and match.group(1).strip().lower() in _RECOVERY_ACTIONS:
            return _RECOVERY_ACTIONS[match.group(1).strip().lower()]
    return DEFAULT_XID_RULES.get(xid, UNKNOWN_XID_RULE)


@dataclass(frozen=True)
class KmsgXid:
    """One ``NVRM: Xid`` line from the kernel log."""

    pci: str  # normalised "0000:3b:00"
    xid: int
    message: str


# NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
_XID_RE = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?\):"
    r"\s*(?P<xid>\d+),?\s*(?P<rest>.*)$"
)


def normalise_pci(bus_id: str) -> str:
    """``00000000:3B:00.0`` or ``0000:3b:00`` -> ``0000:3b:00`` (domain 4 digits, lower case)."""
    text = bus_id.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return text
    domain, bus, devfn = parts
    device = devfn.split(".")[0]
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"
    except ValueError:
        return text


def parse_kmsg_line(line: str) -> KmsgXid | None:
    """Parse one kernel log record (``/dev/kmsg`` format ``prio,seq,ts,flags;text`` or
    plain dmesg text); None when it is not an XID line."""
    text = line.split(";", 1)[1] if ";" in line.split(" ", 1)[0] else line
    match = _XID_RE.search(text.strip())
    if match is None:
        return None
    return KmsgXid(normalise_pci(match["pci"]), int(match["xid"]), match["rest"].strip())


class KmsgReader:
    """Reads new kernel log records without blocking, at most ``max_records`` per call.

    ``/dev/kmsg`` gives one record per ``read()`` and the whole ring buffer of this
    boot from the start, which is what we want: an XID logged before the agent
    (re)started still applies. A regular file (tests, a syslog copy) is read line by
    line from where the previous call stopped.
    """

    def __init__(self, path: Path, max_records: int = 1000) -> None:
        self.path = path
        self.max_records = max_records
        self._fd: int | None = None
        self._is_char = False
        self._pending = b""

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self._is_char = stat.S_ISCHR(os.fstat(self._fd).st_mode)
        return self._fd

    def read_lines(self) -> list[str]:
        """New complete records since the last call. Raises OSError when the source
        cannot be opened (the caller reports that as UNKNOWN, not as a sick GPU)."""
        fd = self._open()
        lines: list[str] = []
        while len(lines) < self.max_records:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # ring buffer overwrote records we had not read
                    continue
                raise
            if not chunk:
                break
            if self._is_char:
                lines.append(chunk.decode("utf-8", "replace").rstrip("\n"))
                continue
            self._pending += chunk
            *complete, self._pending = self._pending.split(b"\n")
            lines.extend(c.decode("utf-8", "replace") for c in complete)
        return lines[: self.max_records] if self._is_char else lines

    def read_xids(self) -> list[KmsgXid]:
        """The XID records among the new lines."""
        return [x for x in (parse_kmsg_line(line) for line in self.read_lines()) if x]

    def close(self) -> None:
        """Close the file descriptor."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
