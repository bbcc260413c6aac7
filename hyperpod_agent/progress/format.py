"""The progress record: one fixed-size file per training rank, written in place.

A rank's process maps ``<root>/<job_id>/<rank>.prog`` and updates it on every
``progress.step``; the node's agent reads it each cycle. The layout is fixed so a write
is a few ``pack_into`` calls on a shared mapping (no syscall), and a reader never
parses anything of unbounded size.

A seqlock keeps reads whole: the writer makes ``seq`` odd, writes, makes it even; a
reader that sees an odd ``seq`` or a ``seq`` that changed under it reads again.

Layout (little-endian, ``SIZE`` bytes)::

    0   8s  magic  b"HPPROG1\\0"
    8   I   version (1)
    12  I   seq (odd while a write is under way)
    16  q   pid of the writing process
    24  q   job id
    32  i   rank (SLURM_PROCID)
    36  I   paused (0 or 1)
    40  d   created_at (epoch s)
    48  q   step: the last finished step (-1: none yet)
    56  d   step_at: when it finished (epoch s; 0: none)
    64  d   pause_since (epoch s): when the current paused phase began, or when the last
            one ended while not paused (a hang's clock restarts there); 0: never paused
    72  56s pause reason (ASCII, NUL-padded)
    128 d   hang_factor override (0: the controller's)
    136 d   hang_min_s override (0: the controller's)
    144 I   durations recorded in total
    148 I   compute_total: durations recorded with a compute time, in total (0: none ever)
    152 128f ring of the latest step durations (s); slot = (total - 1) % RING
    664 64f ring of the compute times of the latest steps (s), beside their durations:
            slot = (total - 1) % COMPUTE_RING; NaN for a step recorded without one

The compute figures came after the first layout and sit where it keeps nothing (its
reserved word, zero, and bytes past its ring, zero): the version is still 1, a reader of
the first layout ignores them, and a record of the first writer reads as one without
compute times (``compute_total`` 0).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"HPPROG1\0"
VERSION = 1
RING = 128
SIZE = 1024
REASON_LEN = 56
DEFAULT_ROOT = Path("/dev/shm/hyperpod-progress")
ROOT_ENV = "HYPERPOD_PROGRESS_DIR"
SUFFIX = ".prog"

HEADER = struct.Struct("<8sII")  # magic, version, seq
SEQ = struct.Struct("<I")
SEQ_OFFSET = 12
IDENTITY = struct.Struct("<qqi")  # pid, job id, rank
IDENTITY_OFFSET = 16
STATE = struct.Struct("<Idqdd56sdd")  # paused, created, step, step_at, pause_since, ...
STATE_OFFSET = 36
TOTAL = struct.Struct("<I")
TOTAL_OFFSET = 144
DURATION = struct.Struct("<f")
RING_OFFSET = 152
RING_STRUCT = struct.Struct(f"<{RING}f")
COMPUTE_TOTAL = struct.Struct("<I")
COMPUTE_TOTAL_OFFSET = 148
COMPUTE_RING = 64  # what is left of SIZE holds 90 floats: the newest 64 steps
COMPUTE = struct.Struct("<f")
COMPUTE_RING_OFFSET = RING_OFFSET + RING_STRUCT.size
COMPUTE_RING_STRUCT = struct.Struct(f"<{COMPUTE_RING}f")

assert COMPUTE_RING_OFFSET + COMPUTE_RING_STRUCT.size <= SIZE


def root() -> Path:
    """Where progress records live on this node (``HYPERPOD_PROGRESS_DIR``)."""
    value = os.environ.get(ROOT_ENV, "")
    return Path(value) if value else DEFAULT_ROOT


def record_path(base: Path, job_id: int, rank: int) -> Path:
    return base / str(job_id) / f"{rank}{SUFFIX}"


@dataclass(frozen=True)
class Record:
    """One rank's progress as read from its file."""

    pid: int
    job_id: int
    rank: int
    paused: bool
    created_at: float
    step: int
    step_at: float
    pause_since: float
    pause_reason: str
    hang_factor: float
    hang_min_s: float
    total: int
    durations: tuple[float, ...]  # the ring's filled slots, oldest first
    # The compute time of each of the newest min(total, COMPUTE_RING) durations, oldest
    # first, NaN where the step had none; () when the rank never recorded one.
    compute: tuple[float, ...] = ()
    compute_total: int = 0


class FormatError(ValueError):
    """Bytes that are not a whole, valid progress record."""


def decode(data: bytes) -> Record:
    """A record from its bytes (one consistent copy). Raises FormatError."""
    if len(data) != SIZE:
        raise FormatError(f"size {len(data)}, expected {SIZE}")
    magic, version, seq = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise FormatError("not a progress record (bad magic)")
    if version != VERSION:
        raise FormatError(f"version {version}, expected {VERSION}")
    if seq % 2:
        raise FormatError("a write is under way")
    pid, job_id, rank = IDENTITY.unpack_from(data, IDENTITY_OFFSET)
    (paused, created, step, step_at, pause_since, reason, factor, floor) = STATE.unpack_from(
        data, STATE_OFFSET
    )
    (total,) = TOTAL.unpack_from(data, TOTAL_OFFSET)
    ring = RING_STRUCT.unpack_from(data, RING_OFFSET)
    filled = min(total, RING)
    if total <= RING:
        durations = ring[:filled]
    else:
        start = total % RING
        durations = ring[start:] + ring[:start]
    (compute_total,) = COMPUTE_TOTAL.unpack_from(data, COMPUTE_TOTAL_OFFSET)
    compute = _compute(data, total) if compute_total else ()
    try:
        text = reason.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError as exc:
        raise FormatError("pause reason is not ASCII") from exc
    return Record(
        pid=pid,
        job_id=job_id,
        rank=rank,
        paused=bool(paused),
        created_at=created,
        step=step,
        step_at=step_at,
        pause_since=pause_since,
        pause_reason=text,
        hang_factor=factor,
        hang_min_s=floor,
        total=total,
        durations=tuple(durations),
        compute=compute,
        compute_total=compute_total,
    )


def _compute(data: bytes, total: int) -> tuple[float, ...]:
    """The compute ring's slots of the newest min(total, COMPUTE_RING) steps, oldest first."""
    ring = COMPUTE_RING_STRUCT.unpack_from(data, COMPUTE_RING_OFFSET)
    if total <= COMPUTE_RING:
        return ring[:total]
    start = total % COMPUTE_RING
    return ring[start:] + ring[:start]
