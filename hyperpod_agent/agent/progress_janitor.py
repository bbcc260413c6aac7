"""Remove the progress records of jobs that are over.

Progress records live in RAM (``/dev/shm``) and nothing else removes them once a job's
processes are gone. A job directory ``<progress_dir>/<job id>/`` goes when every entry
in it is a record file (``<rank>.prog``, a regular file), no record's process is alive,
and none moved (created, stepped, paused) for ``stale_s``; a record that cannot be read
counts by its file's age. Anything else in the directory (another name, a symbolic link,
more than ``MAX_RANKS`` entries) keeps it. Nothing is followed: every removal is made
relative to a directory descriptor opened with ``O_NOFOLLOW``. The work is bounded: a
sweep every ``every_s`` at most, looking at ``max_dirs`` directories at most, the oldest
first; a directory changed within ``stale_s`` is not even opened.

At start the agent (root) makes the root a root-owned directory of mode 1777, so every
user's job can create its directory there and nobody can take another's.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from hyperpod_agent.agent.progress_files import (
    MAX_RANKS,
    OPEN_DIR,
    Skip,
    job_id_of,
    last_activity,
    listing,
    printable,
    rank_of,
    read_record,
)
from hyperpod_agent.shared_root import prepare_shared_root

log = logging.getLogger(__name__)


class ProgressJanitor:
    """Periodic sweep of one progress root (see the module doc)."""

    def __init__(
        self,
        root: Path,
        *,
        stale_s: float,
        procfs: Path = Path("/proc"),
        every_s: float = 60.0,
        max_dirs: int = 32,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.stale_s = stale_s
        self.procfs = procfs
        self.every_s = every_s
        self.max_dirs = max_dirs
        self._clock = clock
        self._next = 0.0

    def prepare_root(self) -> None:
        """At agent start: make the root root-owned with mode 1777. Never raises."""
        if os.geteuid() != 0:
            log.info("progress root %s: not root, leaving its ownership as it is", self.root)
            return
        try:
            prepare_shared_root(self.root)
        except OSError as exc:
            log.error("progress root %s: couldn't prepare it: %s", self.root, exc)

    def maybe_sweep(self) -> list[int]:
        """Sweep if due; never raises (a janitor must not stop the agent)."""
        now = time.monotonic()
        if now < self._next:
            return []
        self._next = now + self.every_s
        try:
            return self.sweep()
        except Exception:  # noqa: BLE001 - logged; the agent's cycle goes on
            log.exception("progress sweep of %s failed; nothing more removed", self.root)
            return []

    def sweep(self) -> list[int]:
        """Remove the directories of jobs that are over; their ids."""
        try:
            root_fd = os.open(self.root, OPEN_DIR)
        except FileNotFoundError:
            return []
        try:
            removed = []
            for job, name in self._candidates(root_fd):
                if self._remove_if_over(root_fd, job, name):
                    removed.append(job)
            return removed
        finally:
            os.close(root_fd)

    def _candidates(self, root_fd: int) -> list[tuple[int, str]]:
        """Job directories unchanged for ``stale_s``, the oldest ``max_dirs``."""
        cutoff = self._clock() - self.stale_s
        found: list[tuple[float, int, str]] = []
        for entry in listing(root_fd)[0]:
            job = job_id_of(entry.name)
            if job is None:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_mtime <= cutoff:
                found.append((st.st_mtime, job, entry.name))
        found.sort()
        return [(job, name) for _, job, name in found[: self.max_dirs]]

    def _remove_if_over(self, root_fd: int, job: int, name: str) -> bool:
        try:
            job_fd = os.open(name, OPEN_DIR, dir_fd=root_fd)
        except OSError:
            return False  # gone, or replaced by something that is not a directory
        try:
            records = self._records_if_over(job_fd)
            if records is None:
                return False
            for record in records:
                os.unlink(record, dir_fd=job_fd)
        except OSError as exc:
            log.warning("progress of job %d: couldn't remove its records: %s", job, exc)
            return False
        finally:
            os.close(job_fd)
        try:
            os.rmdir(name, dir_fd=root_fd)
        except OSError as exc:  # a rank created a record meanwhile: it stays
            log.info("progress of job %d: kept %s: %s", job, printable(name), exc.strerror)
            return False
        log.info(
            "removed the progress records of job %d (%s): no process left, idle for %g s",
            job,
            printable(str(self.root / name)),
            self.stale_s,
        )
        return True

    def _records_if_over(self, job_fd: int) -> list[str] | None:
        """The names of a job directory's records if the job is over, else None."""
        entries, more = listing(job_fd)
        if more or len(entries) > MAX_RANKS:
            return None
        cutoff = self._clock() - self.stale_s
        names = []
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if rank_of(entry.name) is None or not stat.S_ISREG(st.st_mode):
                return None
            try:
                record, _ = read_record(job_fd, entry.name)
            except Skip:
                if st.st_mtime > cutoff:
                    return None
            else:
                if last_activity(record) > cutoff or self._alive(record.pid):
                    return None
            names.append(entry.name)
        return names

    def _alive(self, pid: int) -> bool:
        if pid <= 0:
            return False
        try:
            os.stat(self.procfs / str(pid))
        except FileNotFoundError:
            return False
        except OSError:
            return True  # cannot tell: keep
        return True
