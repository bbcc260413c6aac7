"""Free the checkpoint memory tiers of jobs that are over, and of runs that are over.

A job's memory directory (``<root>/<job id>/`` on ``/dev/shm``) holds one directory per
run (``run-<namespace>/``, see hyperpod_agent/checkpoint/identity.py) and must outlive its
processes: a requeued job restores from it on the same node. Nothing else removes it once
the job is finished for good, and RAM-backed directories would slowly fill the node. The
agent sweeps them:

- a job directory idle for ``idle_s`` goes when Slurm says its job is finished or no
  longer knows it;
- inside the directory of a *running* job, a run's directory idle for ``idle_s`` that no
  live process holds (its ``.lock``) goes: another run of the job (a fine-tune after a
  pre-train, a job id Slurm handed out again) that the job will not restore.

Any doubt (Slurm unreachable, output we did not expect, a name that is not a job id, a
lock we cannot test) keeps the directory. At start the agent (root) makes the root a
root-owned directory of mode 1777, so every user's job can create its private directory
there and nobody can take another's.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.shared_root import (
    DEFAULT_MEMORY_ROOT,
    LOCK_FILE,
    RUN_DIR_RE,
    SPARE_PREFIX,
    prepare_shared_root,
)

log = logging.getLogger(__name__)

MAX_CHECKS_PER_SWEEP = 20  # one small RPC each; the rest wait for the next sweep
# ASCII digits only, matched whole: str.isdigit() accepts digits int() refuses ("²").
_JOB_RE = re.compile(r"[0-9]{1,18}", re.ASCII)
_LEGACY_STEP_RE = re.compile(r"step-[0-9]{10}", re.ASCII)  # before runs had directories

# "finished", "running", "active" (pending, suspended...), or raises: how Slurm sees a job.
JobLookup = Callable[[int], str]


class MemoryTierConfig(BaseModel):
    """``[memory_tier]``: where checkpoint memory tiers live on this node, and when the
    agent may free those of finished jobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cleanup: bool = True
    root: Path = DEFAULT_MEMORY_ROOT
    idle_s: float = Field(default=3600.0, ge=60, le=30 * 86400)
    sweep_every_s: float = Field(default=600.0, ge=10, le=86400)


def slurm_lookup(slurm_conf: str | None, timeout: float = 10.0) -> JobLookup:
    """A lookup through ``scontrol show job`` (one job per call, cheap for slurmctld)."""
    from hyperpod_agent.slurm.client import SlurmClient
    from hyperpod_agent.slurm.parse import FINISHED_STATES

    client = SlurmClient(slurm_conf=slurm_conf, timeout=timeout)

    def lookup(job_id: int) -> str:
        job = client.job(job_id)
        if job is None or job.state in FINISHED_STATES:
            return "finished"
        return "running" if job.state == "RUNNING" else "active"

    return lookup


class MemoryTierJanitor:
    """Periodic sweep of one memory-tier root (see module doc)."""

    def __init__(
        self,
        config: MemoryTierConfig,
        lookup: JobLookup,
        on_removed: Callable[[int], None] | None = None,
    ) -> None:
        self.config = config
        self.lookup = lookup
        self.on_removed = on_removed
        self._next = 0.0
        self._thread: threading.Thread | None = None

    def prepare_root(self) -> None:
        """At agent start: make the root root-owned with mode 1777. Never raises."""
        if os.geteuid() != 0:
            log.info("memory root %s: not root, leaving its ownership as it is", self.config.root)
            return
        try:
            prepare_shared_root(self.config.root)
        except OSError as exc:
            log.error("memory root %s: couldn't prepare it: %s", self.config.root, exc)

    def due(self) -> bool:
        """True when a sweep is due."""
        return self.config.cleanup and time.monotonic() >= self._next

    def maybe_sweep(self) -> list[int]:
        """Sweep if due; never raises (a janitor must not stop the agent)."""
        if not self.due():
            return []
        self._next = time.monotonic() + self.config.sweep_every_s
        try:
            return self.sweep()
        except Exception:  # noqa: BLE001 - logged; the agent's cycle goes on
            log.exception("memory tier sweep of %s failed; nothing removed", self.config.root)
            return []

    def start_if_due(self) -> threading.Thread | None:
        """Sweep in a background thread if due: a slow slurmctld must never hold up the
        agent's cycle (and with it the health cache and the systemd watchdog)."""
        if self._thread is not None and self._thread.is_alive():
            return None
        if not self.due():
            return None
        self._thread = threading.Thread(
            target=self.maybe_sweep, name="hyperpod-memory-tier-janitor", daemon=True
        )
        self._thread.start()
        return self._thread

    def job_dirs(self) -> Iterator[tuple[int, Path]]:
        """Directories of the root whose name is a job id (never symbolic links)."""
        try:
            entries = list(os.scandir(self.config.root))
        except FileNotFoundError:
            return
        for entry in entries:
            if _JOB_RE.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                yield int(entry.name), Path(entry.path)

    def candidates(self) -> list[tuple[int, Path]]:
        """Job directories idle for ``idle_s``, oldest first."""
        now = time.time()
        found: list[tuple[float, int, Path]] = []
        for job, path in self.job_dirs():
            try:
                idle = now - _newest_mtime(path)
            except OSError:
                continue
            if idle >= self.config.idle_s:
                found.append((-idle, job, path))
        found.sort()
        return [(job, path) for _, job, path in found]

    def stale_runs(self, job_dir: Path) -> list[Path]:
        """Runs in a job directory that no live process holds, idle for ``idle_s``
        (including files of the layout before runs had directories)."""
        now = time.time()
        stale: list[Path] = []
        try:
            entries = list(os.scandir(job_dir))
        except OSError:
            return []
        for entry in entries:
            path = Path(entry.path)
            try:
                if RUN_DIR_RE.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                    if not _in_use(path) and now - _newest_mtime(path) >= self.config.idle_s:
                        stale.append(path)
                elif _LEGACY_STEP_RE.fullmatch(entry.name) or entry.name.startswith(SPARE_PREFIX):
                    st = entry.stat(follow_symlinks=False)
                    if now - st.st_mtime >= self.config.idle_s:
                        stale.append(path)
            except OSError:
                continue
        return sorted(stale)

    def sweep(self) -> list[int]:
        """Remove the directories of finished jobs and the stale runs of running ones;
        return the ids of the jobs whose directory went."""
        removed: list[int] = []
        verdicts: dict[int, str] = {}

        def verdict(job: int) -> str | None:
            if job not in verdicts:
                if len(verdicts) >= MAX_CHECKS_PER_SWEEP:
                    return None  # the rest wait for the next sweep
                try:
                    verdicts[job] = self.lookup(job)
                except HyperpodError as exc:
                    log.warning("memory tier sweep: job %d: %s; keeping everything", job, exc)
                    raise _SlurmUnreachable from exc  # the next ones would fail the same way
            return verdicts[job]

        try:
            for job, path in self.candidates():
                if verdict(job) == "finished" and self._remove_job(job, path):
                    removed.append(job)
            for job, path in self.job_dirs():
                stale = self.stale_runs(path)
                if stale and verdict(job) == "running":
                    for run in stale:
                        self._remove_run(job, run)
        except _SlurmUnreachable:
            pass
        return removed

    def _remove_job(self, job: int, path: Path) -> bool:
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            log.warning("memory tier of finished job %d: could not remove %s", job, path)
            return False
        log.info("freed the checkpoint memory tier of finished job %d (%s)", job, path)
        if self.on_removed is not None:
            self.on_removed(job)
        return True

    def _remove_run(self, job: int, path: Path) -> None:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)  # never follows symbolic links
        else:
            path.unlink(missing_ok=True)
        if path.exists():
            log.warning("memory tier of job %d: could not remove %s", job, path)
        else:
            log.info("freed the memory tier of another run of running job %d (%s)", job, path)


class _SlurmUnreachable(Exception):
    """A lookup failed: the sweep stops and removes nothing more."""


def _in_use(run_dir: Path) -> bool:
    """True if a live process holds the run's lock, or if we cannot tell."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _newest_mtime(path: Path, depth: int = 2) -> float:
    """Newest mtime of a directory and the directories below it, ``depth`` levels down
    (a job directory, its runs, their steps: a save touches those)."""
    newest = path.stat().st_mtime
    if depth == 0:
        return newest
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                newest = max(newest, _newest_mtime(Path(entry.path), depth - 1))
    return newest
