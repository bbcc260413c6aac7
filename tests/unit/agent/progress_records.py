"""Progress records written byte for byte from progress_format's Structs, and real
processes to own them, for the agent's tests (the training side has its own writer)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hyperpod_agent.progress import format as pf


def encode(
    pid: int,
    job_id: int,
    rank: int,
    *,
    step: int = -1,
    step_at: float = 0.0,
    created_at: float | None = None,
    paused: bool = False,
    pause_since: float = 0.0,
    reason: bytes = b"",
    hang_factor: float = 0.0,
    hang_min_s: float = 0.0,
    durations: Sequence[float] = (),
    seq: int = 2,
    magic: bytes = pf.MAGIC,
    version: int = pf.VERSION,
) -> bytes:
    """One record's bytes; durations are recorded oldest first, as a writer would."""
    buf = bytearray(pf.SIZE)
    pf.HEADER.pack_into(buf, 0, magic, version, seq)
    pf.IDENTITY.pack_into(buf, pf.IDENTITY_OFFSET, pid, job_id, rank)
    created = time.time() if created_at is None else created_at
    pf.STATE.pack_into(
        buf,
        pf.STATE_OFFSET,
        int(paused),
        created,
        step,
        step_at,
        pause_since,
        reason,
        hang_factor,
        hang_min_s,
    )
    for i, duration in enumerate(durations):
        pf.DURATION.pack_into(buf, pf.RING_OFFSET + 4 * (i % pf.RING), duration)
    pf.TOTAL.pack_into(buf, pf.TOTAL_OFFSET, len(durations))
    return bytes(buf)


def write(root: Path, job_id: int, rank: int, data: bytes, *, mtime: float | None = None) -> Path:
    """``data`` at ``<root>/<job_id>/<rank>.prog`` (directories made as needed)."""
    path = pf.record_path(root, job_id, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def record(root: Path, pid: int, job_id: int, rank: int, **fields: object) -> Path:
    """A valid record of ``pid`` for job ``job_id``, rank ``rank``."""
    return write(root, job_id, rank, encode(pid, job_id, rank, **fields))  # type: ignore[arg-type]


def proc_state(pid: int) -> str:
    """The state letter of ``pid`` as /proc shows it now ('' if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ""
    return text.rsplit(")", 1)[1].split()[0]


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``predicate`` until true; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def dead_pid() -> int:
    """The pid of a child that exited and was reaped (so no process has it now)."""
    child = subprocess.Popen(["true"])
    child.wait(10)
    assert not os.path.exists(f"/proc/{child.pid}")
    return child.pid
