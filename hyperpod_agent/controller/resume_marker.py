"""``<checkpoint_root>/<jobid>/resume.json``: the step a requeued job resumed from.

The checkpoint library writes it when a job resumes (contract in docs/auto-resume.md):
``{"job_id": 12, "restart_count": 1, "step": 1500, "at": "2026-11-22T07:30:00Z"}``.
The controller only reads it. Reading (``read_marker``) is separate from parsing
(``parse_marker``, pure). The directory belongs to the job's user, so the controller,
running as root, opens the file without following symlinks, refuses anything but a
regular file and reads a bounded amount: a user cannot make it read /dev/zero, block
on a FIFO or follow a link into a file it may not see.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MARKER = "resume.json"
MAX_BYTES = 4096
# Bounds on what a user's file may say: a step fits a double exactly and the store's
# 64-bit integers with room; job ids and restart counts are Slurm's 32-bit numbers.
MAX_VALUE = {"step": 2**53, "job_id": 2**32 - 1, "restart_count": 2**32 - 1}


class MarkerError(ValueError):
    """A marker that is not what the contract says; the message says why."""


@dataclass(frozen=True)
class ResumeMarker:
    job_id: int
    step: int
    restart_count: int | None = None


def marker_path(root: Path, job_id: int) -> Path:
    return root / str(job_id) / MARKER


def _int(doc: dict[str, object], key: str, required: bool) -> int | None:
    value = doc.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MarkerError(f"{key}: expected a non-negative integer, got {_short(value)}")
    if value > MAX_VALUE[key]:
        bound = "2**53" if key == "step" else str(MAX_VALUE[key])
        raise MarkerError(f"{key}: expected an integer from 0 to {bound}, got {_short(value)}")
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_marker(text: str, job_id: int) -> ResumeMarker:
    """Parse a marker written for ``job_id``; MarkerError when it is not valid."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise MarkerError(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MarkerError("expected a JSON object")
    written_for = _int(doc, "job_id", required=False)
    if written_for is not None and written_for != job_id:
        raise MarkerError(f"job_id is {written_for}, expected {job_id}")
    step = _int(doc, "step", required=True)
    assert step is not None
    return ResumeMarker(job_id, step, _int(doc, "restart_count", required=False))


def stat_marker(path: Path) -> float | None:
    """The marker's mtime (None when absent): the cheap check made every pass."""
    try:
        return path.lstat().st_mtime
    except OSError:
        return None


def read_marker(path: Path) -> str:
    """The marker's text; OSError or MarkerError when it cannot or must not be read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MarkerError("not a regular file")
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise MarkerError(f"larger than {MAX_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise MarkerError("not UTF-8") from None
