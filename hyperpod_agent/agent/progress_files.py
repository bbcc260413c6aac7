"""Progress records on disk: names, safe reads, /proc, summaries (pure where it can be).

Shared by the agent's reader (progress_reader.py) and its janitor (progress_janitor.py).
Every open is relative to a directory descriptor and never follows a symbolic link; a
record is read whole under its seqlock or not at all (see progress/format.py).
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from collections.abc import Iterator, Sequence

from hyperpod_agent.health import MAX_JOB_ID
from hyperpod_agent.progress import format as pf

MAX_RANKS = 256  # JobProgress.ranks holds no more
MAX_NAMES = 1024  # entries looked at in one directory per cycle
TRIES = 4  # seqlock reads before giving up for this cycle
MAX_DURATION_S = 1e7  # what RankProgress accepts

REASONS = (
    "bad_name",
    "symlink",
    "not_directory",
    "not_regular",
    "size",
    "format",
    "garbage",
    "torn",
    "job_mismatch",
    "rank_mismatch",
    "foreign",
    "stale",
    "too_many_jobs",
    "too_many_ranks",
    "unreadable",
)

# ASCII digits only, matched whole: int() also takes "５０".
_JOB_RE = re.compile(r"[0-9]{1,10}", re.ASCII)
_RANK_RE = re.compile(r"([0-9]{1,8})" + re.escape(pf.SUFFIX), re.ASCII)
OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_SEQ_END = pf.SEQ_OFFSET + pf.SEQ.size


class Skip(Exception):
    """A record not to use, with the reason (one of REASONS) and what was seen."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail


def job_id_of(name: str) -> int | None:
    """The job id a directory name stands for, or None."""
    if not _JOB_RE.fullmatch(name):
        return None
    job = int(name)
    return job if 0 < job <= MAX_JOB_ID else None


def rank_of(name: str) -> int | None:
    """The rank a record's file name stands for, or None."""
    m = _RANK_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def printable(path: str) -> str:
    """A name safe for one log line (non-ASCII and undecodable bytes escaped)."""
    return path.encode("ascii", "backslashreplace").decode("ascii")


def parse_proc_stat(text: str) -> str:
    """The state letter in /proc/<pid>/stat text, '' if it is not of that form.

    The second field is the command name in parentheses and may itself hold spaces and
    parentheses, so the state is the first field after the *last* ')'.
    """
    head, sep, tail = text.rpartition(")")
    if not sep or "(" not in head:
        return ""
    fields = tail.split(maxsplit=1)
    return fields[0] if fields and len(fields[0]) == 1 else ""


def parse_proc_uids(text: str) -> tuple[int, ...]:
    """Real and effective uid from /proc/<pid>/status text; () if not there."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            try:
                return tuple(int(v) for v in line.split()[1:3])
            except ValueError:
                return ()
    return ()


def _usable(duration: float) -> bool:
    return math.isfinite(duration) and 0.0 <= duration <= MAX_DURATION_S


def summarise(durations: Sequence[float]) -> tuple[int, float | None, float | None, float | None]:
    """(window, median, p95, last) of step durations, oldest first.

    Only durations a clock can give count (finite, >= 0); p95 is the nearest-rank
    percentile; last is the newest duration, None if that one is not usable.
    """
    last = durations[-1] if durations and _usable(durations[-1]) else None
    usable = sorted(durations)
    # The sum is finite only if every duration is (NaN and inf spread): one pass in C
    # for the usual ring, the filter only when something is off.
    if usable and not (
        math.isfinite(sum(usable)) and usable[0] >= 0.0 and usable[-1] <= MAX_DURATION_S
    ):
        usable = sorted(d for d in durations if _usable(d))  # NaN had broken the order
    n = len(usable)
    if not n:
        return 0, None, None, last
    half = n // 2
    median = usable[half] if n % 2 else (usable[half - 1] + usable[half]) / 2
    p95 = usable[(95 * n + 99) // 100 - 1]
    return n, median, p95, last


def last_activity(record: pf.Record) -> float:
    """When the record last moved (epoch s): created, a step, a pause."""
    return max(record.created_at, record.step_at, record.pause_since)


def check_values(record: pf.Record) -> None:
    times = (record.created_at, record.step_at, record.pause_since)
    if not all(math.isfinite(t) and t >= 0 for t in times):
        raise Skip("garbage", "a time that is not a clock's")
    if not 0 < record.pid <= 2**31:
        raise Skip("garbage", f"pid {record.pid}")
    if not all(math.isfinite(v) for v in (record.hang_factor, record.hang_min_s)):
        raise Skip("garbage", "a hang override that is not a number")


def read_record(dir_fd: int, name: str) -> tuple[pf.Record, os.stat_result]:
    """The record ``name`` in the directory ``dir_fd``, read whole under the seqlock,
    and its file's status. Raises Skip."""
    try:
        fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Skip("symlink") from None
        raise Skip("unreadable", exc.strerror or str(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Skip("not_regular")
        if st.st_size != pf.SIZE:
            raise Skip("size", f"{st.st_size} bytes, expected {pf.SIZE}")
        return _consistent_copy(fd), st
    finally:
        os.close(fd)


def _consistent_copy(fd: int) -> pf.Record:
    for attempt in range(TRIES):
        if attempt:
            os.sched_yield()  # let a writer that was preempted mid-write finish
        # The sequence number is read on its own before the copy and again after it:
        # the copy's own bytes come from one string copy in the kernel, whose loads
        # the CPU may perform out of order (fast-string copies), so the seq inside
        # the copy does not prove the fields after it were read later.
        before = os.pread(fd, pf.SEQ.size, pf.SEQ_OFFSET)
        data = os.pread(fd, pf.SIZE, 0)
        if len(data) != pf.SIZE:
            raise Skip("size", f"{len(data)} bytes read, expected {pf.SIZE}")
        magic, version, seq = pf.HEADER.unpack_from(data, 0)
        if magic != pf.MAGIC:
            raise Skip("format", "not a progress record (bad magic)")
        if version != pf.VERSION:
            raise Skip("format", f"version {version}, expected {pf.VERSION}")
        after = os.pread(fd, pf.SEQ.size, pf.SEQ_OFFSET)
        if seq % 2 or not before == after == data[pf.SEQ_OFFSET : _SEQ_END]:
            continue  # a write is under way, or one happened under our read
        try:
            return pf.decode(data)
        except pf.FormatError as exc:
            raise Skip("garbage", str(exc)) from None
    raise Skip("torn", f"a write was under way in each of {TRIES} reads")


def listing(dir_fd: int) -> tuple[list[os.DirEntry[str]], bool]:
    """Up to MAX_NAMES entries of a directory, and whether there were more."""
    entries: list[os.DirEntry[str]] = []
    with os.scandir(dir_fd) as it:
        for entry in it:
            if len(entries) == MAX_NAMES:
                return entries, True
            entries.append(entry)
    return entries, False


def with_status(
    entries: list[os.DirEntry[str]],
) -> Iterator[tuple[os.DirEntry[str], os.stat_result]]:
    """Entries with their own status (lstat: a symbolic link is not followed)."""
    for entry in entries:
        try:
            yield entry, entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed since the listing


def read_small(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    finally:
        os.close(fd)
