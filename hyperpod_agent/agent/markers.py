"""Auto-resume markers: how ``srun --auto-resume=N`` inside a batch script reaches the
controller. job_submit never sees that flag, so the SPANK plugin, in slurmstepd where
the job id is known, writes ``<dir>/<jobid>`` containing
``auto_resume=N step=S node=NODE``; the node's agent forwards them in its reports.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

log = logging.getLogger(__name__)

MAX_MARKERS = 256  # a report carries at most this many (newest first)
# A Slurm job id: ASCII digits only ("²".isdigit() is true, and int() refuses it).
JOB_NAME = re.compile(r"[1-9][0-9]{0,9}")
MAX_JOB_ID = 2**32 - 1


def parse_marker(text: str) -> tuple[int, str] | None:
    """(cap, node) from a marker's text; None if it is not one of ours."""
    fields = dict(f.partition("=")[::2] for f in text.split() if "=" in f)
    value = fields.get("auto_resume", "")
    if not re.fullmatch(r"[0-9]{1,6}", value):
        return None
    cap = int(value)
    if not 0 <= cap <= 100_000:
        return None
    return cap, fields.get("node", "")


class MarkerReader:
    """Reads the marker directory when it changed; prunes markers older than
    ``max_age_s`` (their jobs are long gone)."""

    def __init__(self, directory: Path, node: str, max_age_s: float = 2 * 86400) -> None:
        self.directory = directory
        self.node = node
        self.max_age_s = max_age_s
        self._seen_mtime: float | None = None
        self._jobs: dict[int, int] = {}

    def jobs(self) -> dict[int, int]:
        """job id -> --auto-resume cap for jobs that ran a marked step on this node."""
        try:
            mtime = self.directory.stat().st_mtime
        except OSError:
            return {}
        if mtime == self._seen_mtime:
            return dict(self._jobs)
        self._seen_mtime = mtime
        found: list[tuple[float, int, int]] = []
        now = time.time()
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if not JOB_NAME.fullmatch(entry.name) or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    age = now - entry.stat().st_mtime
                    if age > self.max_age_s:
                        os.unlink(entry.path)
                        continue
                    with open(entry.path, encoding="utf-8", errors="replace") as f:
                        parsed = parse_marker(f.read(256))
                except OSError as exc:
                    log.debug("marker %s unreadable: %s", entry.path, exc)
                    continue
                if parsed is None or (parsed[1] and parsed[1] != self.node):
                    continue
                if int(entry.name) <= MAX_JOB_ID:
                    found.append((-age, int(entry.name), parsed[0]))
        found.sort(reverse=True)
        self._jobs = {job: cap for _, job, cap in found[:MAX_MARKERS]}
        return dict(self._jobs)
