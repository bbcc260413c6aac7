"""Training ranks' progress records -> the per-job summary the agent reports.

Each cycle the agent scans ``<progress_dir>/<job id>/<rank>.prog`` (layout in
hyperpod_agent/progress_format.py) and summarises every record it can trust. The
directory is shared by every user of the node, so a file is read only when:

- its name and its directory's name are ASCII job id and rank, and neither is a
  symbolic link (nothing is followed: every open is relative to a directory descriptor
  with ``O_NOFOLLOW``), and it is a regular file of exactly ``SIZE`` bytes (a FIFO
  would block a reader, a 100 MB file is never read);
- a whole copy passes the seqlock (``seq`` even and unchanged after the read; a few
  tries, then not this cycle), the magic and version, and values a clock can give;
- the header names this job and this rank, the file belongs to its directory's owner
  and, while the named process lives, to that process's user;
- it is not stale: a record whose process is gone and that did not move for
  ``stale_s`` is the leftover of a finished job (the janitor removes those).

Anything else is skipped with one log line per file and reason (not one per cycle) and
counted once in ``hyperpod_agent_progress_skipped_total{reason}``. At most ``MAX_JOBS``
jobs, ``MAX_RANKS`` ranks per job and ``MAX_REPORTED_RANKS`` in all are read, the most
recently created first.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pydantic import ValidationError

from hyperpod_agent import progress_format as pf
from hyperpod_agent.health import MAX_JOB_ID, JobProgress, RankProgress

log = logging.getLogger(__name__)

MAX_JOBS = 64  # NodeReport.progress holds no more
MAX_RANKS = 256  # JobProgress.ranks holds no more
# In all: at most about 340 bytes of JSON each, so the report stays well under the
# controller's default body limit (256 KiB) however many jobs a user starts.
MAX_REPORTED_RANKS = 512
MAX_NAMES = 1024  # entries looked at in one directory per cycle
TRIES = 4  # seqlock reads before giving up for this cycle
MAX_DURATION_S = 1e7  # what RankProgress accepts
MAX_HANG_FACTOR = 1000.0

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


def _check_values(record: pf.Record) -> None:
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
        data = os.pread(fd, pf.SIZE, 0)
        if len(data) != pf.SIZE:
            raise Skip("size", f"{len(data)} bytes read, expected {pf.SIZE}")
        magic, version, seq = pf.HEADER.unpack_from(data, 0)
        if magic != pf.MAGIC:
            raise Skip("format", "not a progress record (bad magic)")
        if version != pf.VERSION:
            raise Skip("format", f"version {version}, expected {pf.VERSION}")
        if seq % 2 or os.pread(fd, pf.SEQ.size, pf.SEQ_OFFSET) != data[pf.SEQ_OFFSET : _SEQ_END]:
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


# What one read skipped: relative path -> reason.
_Skipped = dict[str, str]


class ProgressReader:
    """Reads the progress records of one node (see the module doc)."""

    def __init__(
        self,
        root: Path,
        *,
        stale_s: float = 3600.0,
        procfs: Path = Path("/proc"),
        on_skip: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.stale_s = stale_s
        self.procfs = procfs
        self._procfs = str(procfs)  # formatted into two paths per rank per cycle
        self.on_skip = on_skip
        self._clock = clock
        # Skips already logged and counted, by relative path; forgotten when the path is
        # no longer skipped, so a file that comes back bad is told about again.
        self._told: dict[str, str] = {}

    def read(self) -> list[JobProgress]:
        """Every trusted record's summary, by job id. Raises OSError only if the root
        itself cannot be opened (a missing root is no progress)."""
        cycle: _Skipped = {}
        try:
            root_fd = os.open(self.root, OPEN_DIR)
        except FileNotFoundError:
            self._told = {}
            return []
        try:
            jobs = self._jobs(root_fd, cycle)
        finally:
            os.close(root_fd)
        self._told = {p: r for p, r in self._told.items() if cycle.get(p) == r}
        return jobs

    def _skip(self, cycle: _Skipped, path: str, reason: str, detail: str = "") -> None:
        cycle[path] = reason
        if self._told.get(path) == reason:
            return
        self._told[path] = reason
        log.warning(
            "progress record %s skipped (%s)%s",
            printable(str(self.root / path)),
            reason,
            f": {detail}" if detail else "",
        )
        if self.on_skip is not None:
            self.on_skip(reason)

    def _jobs(self, root_fd: int, cycle: _Skipped) -> list[JobProgress]:
        entries, more = listing(root_fd)
        if more:
            self._skip(cycle, ".", "too_many_jobs", f"only {MAX_NAMES} entries looked at")
        found: list[tuple[float, int, str]] = []
        for entry, st in _with_status(entries):
            job = job_id_of(entry.name)
            if job is None:
                self._skip(cycle, entry.name, "bad_name")
            elif stat.S_ISLNK(st.st_mode):
                self._skip(cycle, entry.name, "symlink")
            elif not stat.S_ISDIR(st.st_mode):
                self._skip(cycle, entry.name, "not_directory")
            else:
                found.append((st.st_mtime, job, entry.name))
        found.sort(reverse=True)  # the most recently created first
        for _, _, name in found[MAX_JOBS:]:
            self._skip(cycle, name, "too_many_jobs", f"only the newest {MAX_JOBS} are read")
        out = []
        budget = MAX_REPORTED_RANKS
        for _, job, name in found[:MAX_JOBS]:
            if not budget:
                self._skip(cycle, name, "too_many_ranks", f"{MAX_REPORTED_RANKS} in all")
                continue
            summary = self._job(root_fd, job, name, min(MAX_RANKS, budget), cycle)
            if summary is not None:
                out.append(summary)
                budget -= len(summary.ranks)
        return sorted(out, key=lambda j: j.job_id)

    def _job(
        self, root_fd: int, job: int, name: str, limit: int, cycle: _Skipped
    ) -> JobProgress | None:
        try:
            job_fd = os.open(name, OPEN_DIR, dir_fd=root_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._skip(cycle, name, "symlink")
            elif exc.errno == errno.ENOTDIR:
                self._skip(cycle, name, "not_directory")
            elif exc.errno != errno.ENOENT:
                self._skip(cycle, name, "unreadable", exc.strerror or str(exc))
            return None
        try:
            owner = os.fstat(job_fd).st_uid
            records = self._records(job_fd, job, name, owner, limit, cycle)
        finally:
            os.close(job_fd)
        if not records:
            return None
        return JobProgress(
            job_id=job,
            hang_factor=_override(records, "hang_factor", MAX_HANG_FACTOR),
            hang_min_s=_override(records, "hang_min_s", MAX_DURATION_S),
            ranks=[summary for _, summary in records],
        )

    def _records(
        self, job_fd: int, job: int, dirname: str, owner: int, limit: int, cycle: _Skipped
    ) -> list[tuple[pf.Record, RankProgress]]:
        entries, more = listing(job_fd)
        if more:
            self._skip(cycle, dirname, "too_many_ranks", f"only {MAX_NAMES} entries looked at")
        found: list[tuple[float, int, str]] = []
        for entry, st in _with_status(entries):
            path = f"{dirname}/{entry.name}"
            rank = rank_of(entry.name)
            if rank is None:
                self._skip(cycle, path, "bad_name")
            elif stat.S_ISLNK(st.st_mode):
                self._skip(cycle, path, "symlink")
            elif not stat.S_ISREG(st.st_mode):
                self._skip(cycle, path, "not_regular")
            elif st.st_size != pf.SIZE:
                self._skip(cycle, path, "size", f"{st.st_size} bytes, expected {pf.SIZE}")
            else:
                found.append((-st.st_mtime, rank, entry.name))
        found.sort()  # the most recently created first
        for _, _, name in found[limit:]:
            self._skip(cycle, f"{dirname}/{name}", "too_many_ranks")
        out = []
        for _, rank, name in found[:limit]:
            try:
                out.append(self._rank(job_fd, job, rank, name, owner))
            except Skip as skip:
                self._skip(cycle, f"{dirname}/{name}", skip.reason, skip.detail)
        return sorted(out, key=lambda r: r[1].rank)

    def _rank(
        self, job_fd: int, job: int, rank: int, name: str, owner: int
    ) -> tuple[pf.Record, RankProgress]:
        record, st = read_record(job_fd, name)
        if record.job_id != job:
            raise Skip("job_mismatch", f"the record says job {record.job_id}")
        if record.rank != rank:
            raise Skip("rank_mismatch", f"the record says rank {record.rank}")
        if st.st_uid != owner:
            raise Skip("foreign", f"owned by uid {st.st_uid}, its directory by uid {owner}")
        _check_values(record)
        state, uids = self._process(record.pid)
        if uids and st.st_uid not in uids:
            raise Skip("foreign", f"owned by uid {st.st_uid}, process {record.pid} is uid {uids}")
        if state == "gone":
            idle = self._clock() - last_activity(record)
            if idle >= self.stale_s:
                raise Skip("stale", f"process {record.pid} gone, idle for {idle:.0f} s")
        try:
            return record, _summary(record, state)
        except ValidationError as exc:
            raise Skip("garbage", str(exc.errors()[0]["loc"])) from None

    def _process(self, pid: int) -> tuple[str, tuple[int, ...]]:
        """(state letter or 'gone', (real uid, effective uid)) of a process."""
        base = f"{self._procfs}/{pid}"
        try:
            state = parse_proc_stat(_read_small(f"{base}/stat"))
        except (FileNotFoundError, ProcessLookupError):
            return "gone", ()
        except OSError:
            return "", ()
        try:
            uids = parse_proc_uids(_read_small(f"{base}/status"))
        except OSError:
            uids = ()
        return state, uids


def _with_status(
    entries: list[os.DirEntry[str]],
) -> Iterator[tuple[os.DirEntry[str], os.stat_result]]:
    """Entries with their own status (lstat: a symbolic link is not followed)."""
    for entry in entries:
        try:
            yield entry, entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed since the listing


def _read_small(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    finally:
        os.close(fd)


def _summary(record: pf.Record, state: str) -> RankProgress:
    window, median, p95, last = summarise(record.durations)
    return RankProgress(
        rank=record.rank,
        pid=record.pid,
        step=record.step,
        step_at=record.step_at if record.step_at > 0 else None,
        paused=record.paused,
        pause_reason=record.pause_reason,
        pause_since=record.pause_since if record.pause_since > 0 else None,
        window=window,
        median_s=median,
        p95_s=p95,
        last_s=last,
        proc_state=state,
    )


def _override(
    records: list[tuple[pf.Record, RankProgress]], field: str, top: float
) -> float | None:
    """A job's hang override: the lowest rank's that is set and in range."""
    for record, _ in records:
        value = float(getattr(record, field))
        if 0 < value <= top:
            return value
    return None
