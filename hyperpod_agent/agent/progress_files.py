"""Progress records on disk: names, safe reads, /proc, summaries (pure where it can be).

Shared by the agent's reader (progress_reader.py) and its janitor (progress_janitor.py).
Every open is relative to a directory descriptor and never follows a symbolic link; a
record is read whole under its seqlock or not at all (see progress/format.py).

Which Slurm job a process belongs to is read from the node, never from what a record
says (``membership``): the process's cgroup when it is in one of Slurm's job cgroups
(proctrack/cgroup, task/cgroup), else the ``slurmstepd`` it descends from (a root process
whose title names its job step, ``slurmstepd: [<job>.<step>]``; what proctrack/linuxproc
tracks too).
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hyperpod_agent.health import MAX_JOB_ID
from hyperpod_agent.progress import format as pf

MAX_RANKS = 256  # JobProgress.ranks holds no more
MAX_NAMES = 1024  # entries looked at in one directory per cycle
TRIES = 4  # seqlock reads before giving up for this cycle
MAX_DURATION_S = 1e7  # what RankProgress accepts
# A record and its reader share the node's clock: a time further ahead than a clock
# step could explain was written to dodge the hang clock (or a paused phase's limit).
FUTURE_SLACK_S = 300.0
MAX_DEPTH = 64  # parents walked from a rank up to its slurmstepd
STEPD = "slurmstepd"

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
    "not_in_job",
    "unverified",
    "too_many_jobs",
    "too_many_ranks",
    "unreadable",
)

# ASCII digits only, matched whole: int() also takes "５０".
_JOB_RE = re.compile(r"[0-9]{1,10}", re.ASCII)
_RANK_RE = re.compile(r"([0-9]{1,8})" + re.escape(pf.SUFFIX), re.ASCII)
_PID_RE = re.compile(r"[0-9]{1,10}", re.ASCII)
# slurmstepd's title: "slurmstepd: [12.batch]", "[12.extern]", "[12.0]", "[12+1.0]".
_STEPD_TITLE = re.compile(r"slurmstepd: \[([0-9]{1,10})[.+\]]", re.ASCII)
# Slurm's job cgroups, anchored at the root of the hierarchy: below a subtree delegated
# to a user (systemd's user@.service) anyone may make a "job_<id>" of their own.
# cgroup v2: /system.slice/slurmstepd.scope/job_<id>/... (<node>_slurmstepd.scope with
# several slurmd per host); v1: /slurm/uid_<uid>/job_<id>/... (/slurm_<node>/...).
_CGROUP_V2 = re.compile(
    r"/system\.slice/(?:[^/]+_)?slurmstepd\.scope/job_([0-9]{1,10})(?:/|$)", re.ASCII
)
_CGROUP_V1 = re.compile(r"/slurm(?:_[^/]+)?/uid_([0-9]{1,10})/job_([0-9]{1,10})(?:/|$)", re.ASCII)
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


def parse_stat(text: str) -> tuple[str, str, int] | None:
    """(command name, state letter, parent pid) from /proc/<pid>/stat text, or None.

    The second field is the command name in parentheses and may itself hold spaces and
    parentheses, so it ends at the *last* ')' and the state is the first field after it.
    """
    head, sep, tail = text.rpartition(")")
    start = head.find("(")
    fields = tail.split(maxsplit=2)
    if not sep or start < 0 or len(fields) < 2 or len(fields[0]) != 1:
        return None
    if not _PID_RE.fullmatch(fields[1]):
        return None
    return head[start + 1 :], fields[0], int(fields[1])


def parse_proc_stat(text: str) -> str:
    """The state letter in /proc/<pid>/stat text, '' if it is not of that form."""
    parsed = parse_stat(text)
    return parsed[1] if parsed is not None else ""


def parse_proc_uids(text: str) -> tuple[int, ...]:
    """Real and effective uid from /proc/<pid>/status text; () if not there."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            try:
                return tuple(int(v) for v in line.split()[1:3])
            except ValueError:
                return ()
    return ()


def parse_stepd_title(cmdline: str) -> int | None:
    """The job a slurmstepd's title (its /proc/<pid>/cmdline) names, or None."""
    m = _STEPD_TITLE.match(cmdline)
    return job_id_of(m.group(1)) if m else None


def parse_slurm_cgroup(text: str) -> tuple[frozenset[int], frozenset[int]]:
    """(the Slurm jobs, the users they name) of /proc/<pid>/cgroup text: empty when the
    process is in none of Slurm's job cgroups. Only cgroup v1 paths name the user."""
    jobs: set[int] = set()
    users: set[int] = set()
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if m := _CGROUP_V2.match(path):
            jobs.add(int(m.group(1)))
        elif m := _CGROUP_V1.match(path):
            users.add(int(m.group(1)))
            jobs.add(int(m.group(2)))
    return frozenset(jobs), frozenset(users)


@dataclass(frozen=True)
class NodeProcs:
    """One look at the node's processes: who is whose parent, and the slurmstepd of
    each job step running here (pid -> job id)."""

    parents: dict[int, int]
    stepds: dict[int, int]

    @property
    def jobs(self) -> set[int]:
        """The jobs with a step on this node."""
        return set(self.stepds.values())


@dataclass(frozen=True)
class Membership:
    """The job a process belongs to, as the node shows it."""

    job: int
    user: int | None  # the job's user as the node shows it; None where it does not
    how: str  # "cgroup" or "slurmstepd"


def read_procs(procfs: str) -> NodeProcs:
    """Every process's parent, and the job of every slurmstepd, from ``procfs``.

    A slurmstepd counts only when it runs as root (real and effective uid 0): anyone may
    name a program ``slurmstepd`` and give it any title, only root may run it as root.
    """
    parents: dict[int, int] = {}
    stepds: dict[int, int] = {}
    with os.scandir(procfs) as it:
        names = [e.name for e in it if _PID_RE.fullmatch(e.name)]
    for name in names:
        try:
            parsed = parse_stat(read_small(f"{procfs}/{name}/stat"))
        except OSError:
            continue  # exited since the listing
        if parsed is None:
            continue
        comm, _, ppid = parsed
        pid = int(name)
        parents[pid] = ppid
        if comm == STEPD:
            job = _stepd_job(procfs, pid)
            if job is not None:
                stepds[pid] = job
    return NodeProcs(parents, stepds)


def _stepd_job(procfs: str, pid: int) -> int | None:
    try:
        uids = parse_proc_uids(read_small(f"{procfs}/{pid}/status"))
        title = read_small(f"{procfs}/{pid}/cmdline")
    except OSError:
        return None
    return parse_stepd_title(title) if uids == (0, 0) else None


def membership(procfs: str, pid: int, procs: NodeProcs) -> Membership | None:
    """The job process ``pid`` belongs to, or None (no job, or the node cannot say).

    Its cgroup, where it is in one of Slurm's job cgroups (two jobs at once: None); else
    the slurmstepd it descends from, and then the job's user is the uid of the
    slurmstepd's child it descends through (the task slurmstepd started as that user).
    """
    try:
        jobs, users = parse_slurm_cgroup(read_small(f"{procfs}/{pid}/cgroup"))
    except OSError:
        jobs, users = frozenset(), frozenset()
    if jobs:
        if len(jobs) > 1 or len(users) > 1:
            return None
        return Membership(next(iter(jobs)), next(iter(users), None), "cgroup")
    child, current = 0, pid
    for _ in range(MAX_DEPTH):
        if current in procs.stepds:
            if not child:
                return None  # a slurmstepd itself is no rank
            try:
                uids = parse_proc_uids(read_small(f"{procfs}/{child}/status"))
            except OSError:
                return None
            return Membership(procs.stepds[current], uids[0] if uids else None, "slurmstepd")
        parent = procs.parents.get(current)
        if parent is None:  # started after the look at the node
            try:
                parsed = parse_stat(read_small(f"{procfs}/{current}/stat"))
            except OSError:
                return None
            parent = parsed[2] if parsed is not None else 0
        if parent <= 0:
            return None
        child, current = current, parent
    return None


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


def check_values(record: pf.Record, now: float) -> None:
    times = (record.created_at, record.step_at, record.pause_since)
    if not all(math.isfinite(t) and t >= 0 for t in times):
        raise Skip("garbage", "a time that is not a clock's")
    if max(times) > now + FUTURE_SLACK_S:
        raise Skip("garbage", f"a time {max(times) - now:.0f} s ahead of this node's clock")
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
