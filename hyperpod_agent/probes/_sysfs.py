"""Small readers for sysfs/procfs files, shared by the host probes.

Every path is joined under a root from ``ProbeContext`` so tests point the probes at
fake trees. Readers return ``None`` for a file that does not exist (hardware absent);
other I/O errors propagate so the runner reports the probe as UNKNOWN.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path


def under(root: Path, absolute: str) -> Path:
    """``absolute`` (e.g. ``/class/net``) re-rooted under ``root``."""
    return root / absolute.lstrip("/")


def read_text(path: Path) -> str | None:
    """The stripped content of ``path``, or None when it does not exist.

    Some sysfs attributes refuse to be read in certain states (``carrier`` of an
    interface that is administratively down gives EINVAL); those read as None too.
    """
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENODEV, errno.ENXIO):
            return None
        raise


def read_int(path: Path) -> int | None:
    """``read_text`` parsed as an integer; None when absent or not a number."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.split()[0]) if text else None
    except ValueError:
        return None


def list_dir(path: Path) -> list[str]:
    """Sorted entry names of a directory, empty when it does not exist."""
    try:
        return sorted(p.name for p in path.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


class CounterTracker:
    """Remembers counters between probe runs and reports how much each grew.

    A counter that goes backwards (driver reload, device reset) is re-baselined and
    reported as zero growth rather than as a huge positive jump.
    """

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def delta(self, key: str, value: int) -> int:
        """Growth of ``key`` since the previous call; 0 on the first sighting."""
        previous = self._last.get(key)
        self._last[key] = value
        if previous is None or value < previous:
            return 0
        return value - previous


@dataclass(frozen=True)
class MountEntry:
    mount_point: str
    fstype: str
    source: str
    options: frozenset[str]

    @property
    def readonly(self) -> bool:
        return "ro" in self.options


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> dict[str, MountEntry]:
    """Mount point -> entry; for stacked mounts the last (visible) one wins."""
    mounts: dict[str, MountEntry] = {}
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields or len(fields) < 6:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 3:
            continue
        point = _unescape(fields[4])
        options = set(fields[5].split(",")) | set(
            fields[sep + 3].split(",") if len(fields) > sep + 3 else []
        )
        mounts[point] = MountEntry(
            point, fields[sep + 1], _unescape(fields[sep + 2]), frozenset(options)
        )
    return mounts
