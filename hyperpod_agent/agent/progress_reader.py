"""Training ranks' progress records -> the per-job summary the agent reports.

Each cycle the agent scans ``<progress_dir>/<job id>/<rank>.prog`` (layout in
hyperpod_agent/progress/format.py) and summarises every record it can trust. The
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
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from hyperpod_agent.agent.progress_files import (
    MAX_DURATION_S,
    MAX_NAMES,
    MAX_RANKS,
    OPEN_DIR,
    Skip,
    check_values,
    job_id_of,
    last_activity,
    listing,
    parse_proc_stat,
    parse_proc_uids,
    printable,
    rank_of,
    read_record,
    read_small,
    summarise,
    with_status,
)
from hyperpod_agent.health import JobProgress, RankProgress
from hyperpod_agent.progress import format as pf

log = logging.getLogger(__name__)

MAX_JOBS = 64  # NodeReport.progress holds no more
# In all: at most about 340 bytes of JSON each, so the report stays well under the
# controller's default body limit (256 KiB) however many jobs a user starts.
MAX_REPORTED_RANKS = 512
MAX_HANG_FACTOR = 1000.0

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
        # A stale record is a finished job's leftover, soon swept: nothing to look into.
        log.log(
            logging.INFO if reason == "stale" else logging.WARNING,
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
        for entry, st in with_status(entries):
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
        except OSError as exc:  # one directory we cannot list costs only its job
            self._skip(cycle, name, "unreadable", exc.strerror or str(exc))
            return None
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
        for entry, st in with_status(entries):
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
        check_values(record)
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
            err = exc.errors()[0]
            where = ".".join(str(part) for part in err["loc"])
            raise Skip("garbage", f"{where}: {err['msg']}") from None

    def _process(self, pid: int) -> tuple[str, tuple[int, ...]]:
        """(state letter or 'gone', (real uid, effective uid)) of a process."""
        base = f"{self._procfs}/{pid}"
        try:
            state = parse_proc_stat(read_small(f"{base}/stat"))
        except (FileNotFoundError, ProcessLookupError):
            return "gone", ()
        except OSError:
            return "", ()
        try:
            uids = parse_proc_uids(read_small(f"{base}/status"))
        except OSError:
            uids = ()
        return state, uids


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
