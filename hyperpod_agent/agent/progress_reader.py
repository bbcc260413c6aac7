"""Training ranks' progress records -> the per-job summary the agent reports.

Each cycle the agent looks at the node's processes (``read_procs``: the slurmstepd of
every job step running here) and reads ``<progress_dir>/<job id>/<rank>.prog`` (layout in
hyperpod_agent/progress/format.py) of those jobs only, by name: the shared root is never
listed, so directories made there by anyone else cost nothing and hide nothing. The
directory is shared by every user of the node, so a record counts only when:

- its name and its directory's name are ASCII job id and rank, and neither is a
  symbolic link (nothing is followed: every open is relative to a directory descriptor
  with ``O_NOFOLLOW``), and it is a regular file of exactly ``SIZE`` bytes (a FIFO
  would block a reader, a 100 MB file is never read);
- a whole copy passes the seqlock (``seq`` even and unchanged after the read; a few
  tries, then not this cycle), the magic and version, and values a clock can give (no
  time ahead of this node's clock);
- the header names this job and this rank, and the file belongs to its directory's owner;
- the process it names belongs to the job, as the node shows it (``membership``: its
  Slurm job cgroup, else the job's slurmstepd it descends from), and runs as the file's
  owner (real and effective uid), who is the job's user where the node shows that. The
  report carries that uid; the controller checks it against the job's user in Slurm.
- A record whose process is gone (or no longer the job's) counts, as ``gone``, only if
  this agent saw it in the job before (same file, pid and creation time): a record made
  for a dead process was never anybody's rank. And it is not stale: gone and not moved
  for ``stale_s``, it is the leftover of a finished job (the janitor removes those).

Anything else is skipped with one log line per file and reason (not one per cycle) and
counted once in ``hyperpod_agent_progress_skipped_total{reason}``. At most ``MAX_JOBS``
jobs, ``MAX_RANKS`` ranks per job and ``MAX_REPORTED_RANKS`` in all are read, the jobs
in id order and in each job the most recently created records first.
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
    NodeProcs,
    Skip,
    check_values,
    last_activity,
    listing,
    membership,
    parse_proc_stat,
    parse_proc_uids,
    printable,
    rank_of,
    read_procs,
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
# A record seen in its job: (job, rank) -> (file inode, pid, created_at, uid).
_Seen = dict[tuple[int, int], tuple[int, int, float, int]]


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
        # Records seen in their job (kept while reported): the only ones that may go
        # on being reported once their process is gone.
        self._seen: _Seen = {}

    def read(self) -> list[JobProgress]:
        """Every trusted record's summary, by job id. Raises OSError only if the root
        or the process table cannot be read (a missing root is no progress)."""
        cycle: _Skipped = {}
        seen: _Seen = {}
        try:
            root_fd = os.open(self.root, OPEN_DIR)
        except FileNotFoundError:
            self._told, self._seen = {}, {}
            return []
        try:
            jobs = self._jobs(root_fd, read_procs(self._procfs), seen, cycle)
        finally:
            os.close(root_fd)
        self._told = {p: r for p, r in self._told.items() if cycle.get(p) == r}
        self._seen = seen
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

    def _jobs(
        self, root_fd: int, procs: NodeProcs, seen: _Seen, cycle: _Skipped
    ) -> list[JobProgress]:
        # The jobs with a step here, and those whose records were seen in their job
        # (a node whose ranks all died may have no step of the job left).
        wanted = sorted(procs.jobs | {job for job, _ in self._seen})
        out: list[JobProgress] = []
        budget = MAX_REPORTED_RANKS
        for job in wanted:
            name = str(job)
            if len(out) == MAX_JOBS or not budget:
                if _exists(root_fd, name):  # a job recording nothing here is no news
                    reason, why = (
                        ("too_many_jobs", f"{MAX_JOBS} jobs reported already")
                        if budget
                        else ("too_many_ranks", f"{MAX_REPORTED_RANKS} ranks in all")
                    )
                    self._skip(cycle, name, reason, why)
                continue
            summary = self._job(root_fd, job, name, min(MAX_RANKS, budget), procs, seen, cycle)
            if summary is not None:
                out.append(summary)
                budget -= len(summary.ranks)
        return out

    def _job(
        self,
        root_fd: int,
        job: int,
        name: str,
        limit: int,
        procs: NodeProcs,
        seen: _Seen,
        cycle: _Skipped,
    ) -> JobProgress | None:
        try:
            job_fd = os.open(name, OPEN_DIR, dir_fd=root_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                self._skip(cycle, name, "symlink" if _is_link(root_fd, name) else "not_directory")
            elif exc.errno != errno.ENOENT:  # no directory: the job records nothing here
                self._skip(cycle, name, "unreadable", exc.strerror or str(exc))
            return None
        try:
            owner = os.fstat(job_fd).st_uid
            records = self._records(job_fd, job, name, owner, limit, procs, seen, cycle)
        except OSError as exc:  # one directory we cannot list costs only its job
            self._skip(cycle, name, "unreadable", exc.strerror or str(exc))
            return None
        finally:
            os.close(job_fd)
        if not records:
            return None
        return JobProgress(
            job_id=job,
            uid=owner,
            hang_factor=_override(records, "hang_factor", MAX_HANG_FACTOR),
            hang_min_s=_override(records, "hang_min_s", MAX_DURATION_S),
            ranks=[summary for _, summary in records],
        )

    def _records(
        self,
        job_fd: int,
        job: int,
        dirname: str,
        owner: int,
        limit: int,
        procs: NodeProcs,
        seen: _Seen,
        cycle: _Skipped,
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
                out.append(self._rank(job_fd, job, rank, name, owner, procs, seen))
            except Skip as skip:
                self._skip(cycle, f"{dirname}/{name}", skip.reason, skip.detail)
        return sorted(out, key=lambda r: r[1].rank)

    def _rank(
        self,
        job_fd: int,
        job: int,
        rank: int,
        name: str,
        owner: int,
        procs: NodeProcs,
        seen: _Seen,
    ) -> tuple[pf.Record, RankProgress]:
        record, st = read_record(job_fd, name)
        if record.job_id != job:
            raise Skip("job_mismatch", f"the record says job {record.job_id}")
        if record.rank != rank:
            raise Skip("rank_mismatch", f"the record says rank {record.rank}")
        if st.st_uid != owner:
            raise Skip("foreign", f"owned by uid {st.st_uid}, its directory by uid {owner}")
        now = self._clock()
        check_values(record, now)
        identity = (st.st_ino, record.pid, record.created_at, st.st_uid)
        state = self._verify(job, record, st, procs, self._seen.get((job, rank)) == identity)
        if state == "gone":
            idle = now - last_activity(record)
            if idle >= self.stale_s:
                raise Skip("stale", f"process {record.pid} gone, idle for {idle:.0f} s")
        try:
            summary = _summary(record, state)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(part) for part in err["loc"])
            raise Skip("garbage", f"{where}: {err['msg']}") from None
        seen[(job, rank)] = identity
        return record, summary

    def _verify(
        self, job: int, record: pf.Record, st: os.stat_result, procs: NodeProcs, known: bool
    ) -> str:
        """The state of the record's process once it is shown to be the job's and its
        user's, or 'gone' if it left the job and this record was ``known`` (seen in the
        job before); raises Skip otherwise."""
        state, uids = self._process(record.pid)
        member = membership(self._procfs, record.pid, procs) if state != "gone" else None
        if member is not None and member.job == job:
            if uids[:2] != (st.st_uid, st.st_uid):
                raise Skip(
                    "foreign",
                    f"owned by uid {st.st_uid}, process {record.pid} runs as uid {uids[:2]}",
                )
            if member.user is not None and member.user != st.st_uid:
                raise Skip(
                    "foreign",
                    f"owned by uid {st.st_uid}, job {job}'s user is uid {member.user} "
                    f"({member.how})",
                )
            return state
        if known:  # its process was the job's: it has left the job since
            return "gone"
        if state == "gone":
            idle = self._clock() - last_activity(record)
            # A finished job's leftover (agent restarted since) is no news; a fresh
            # record for a process that no longer exists may be a forgery.
            reason = "stale" if idle >= self.stale_s else "unverified"
            raise Skip(reason, f"process {record.pid} gone, never seen in job {job}")
        where = "no Slurm job" if member is None else f"job {member.job} ({member.how})"
        raise Skip("not_in_job", f"process {record.pid} belongs to {where}, not to job {job}")

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


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _is_link(dir_fd: int, name: str) -> bool:
    """Whether ``name`` is a symbolic link (O_NOFOLLOW with O_DIRECTORY says ENOTDIR)."""
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _summary(record: pf.Record, state: str) -> RankProgress:
    window, median, p95, last = summarise(record.durations)
    # A rank that records its compute time (progress.step(n, compute_s=...)) is judged
    # by it: in a synchronous job every rank's step lasts as long as the slowest's, and
    # median_s is what the controller compares ranks by (p95_s, the hang model, stays
    # the step time). It travels in median_s because the 0.1.0 controller refuses a
    # report with a field it does not know (docs/progress.md, "Stragglers").
    busy, busy_median, _, _ = summarise(record.compute)
    if busy_median is not None and 2 * busy >= len(record.compute):
        median = busy_median
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
    """A job's hang override on this node: the largest its ranks set in range (the
    controller never goes below its own settings, whatever the records say)."""
    values = [v for record, _ in records if 0 < (v := float(getattr(record, field))) <= top]
    return max(values, default=None)
