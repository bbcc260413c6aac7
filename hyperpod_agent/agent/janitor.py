"""Free the checkpoint memory tier of jobs that are over.

A job's memory tier (``<root>/<job id>/`` on ``/dev/shm``) must outlive its processes:
a requeued job restores from it on the same node. Nothing else removes it once the job
is finished for good, and RAM-backed directories of finished jobs would slowly fill the
node. The agent sweeps them: a directory is removed only when it has been idle for
``idle_s`` *and* Slurm says its job is finished or no longer knows it. Any doubt (Slurm
unreachable, output we did not expect, a name that is not a job id) keeps the directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from hyperpod_agent.errors import HyperpodError

log = logging.getLogger(__name__)

MAX_CHECKS_PER_SWEEP = 20  # one small RPC each; the rest wait for the next sweep

# "finished", "active", or raises: how the caller's Slurm sees one job.
JobLookup = Callable[[int], str]


class MemoryTierConfig(BaseModel):
    """``[memory_tier]``: where checkpoint memory tiers live on this node, and when the
    agent may free those of finished jobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cleanup: bool = True
    root: Path = Path("/dev/shm/hyperpod-ckpt")
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
        return "active"

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

    def candidates(self) -> list[tuple[int, Path]]:
        """Job directories idle for ``idle_s``, oldest first."""
        now = time.time()
        found: list[tuple[float, int, Path]] = []
        try:
            entries = list(os.scandir(self.config.root))
        except FileNotFoundError:
            return []
        for entry in entries:
            if not entry.name.isdigit() or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                idle = now - _newest_mtime(Path(entry.path))
            except OSError:
                continue
            if idle >= self.config.idle_s:
                found.append((-idle, int(entry.name), Path(entry.path)))
        found.sort()
        return [(job, path) for _, job, path in found]

    def sweep(self) -> list[int]:
        """Remove the directories of finished jobs; return their job ids."""
        removed: list[int] = []
        for job, path in self.candidates()[:MAX_CHECKS_PER_SWEEP]:
            try:
                verdict = self.lookup(job)
            except HyperpodError as exc:
                log.warning("memory tier sweep: job %d: %s; keeping everything", job, exc)
                return removed  # Slurm unreachable: the next ones would fail the same way
            if verdict != "finished":
                continue
            shutil.rmtree(path, ignore_errors=True)
            if path.exists():
                log.warning("memory tier of finished job %d: could not remove %s", job, path)
                continue
            log.info("freed the checkpoint memory tier of finished job %d (%s)", job, path)
            removed.append(job)
            if self.on_removed is not None:
                self.on_removed(job)
        return removed


def _newest_mtime(path: Path) -> float:
    """Newest mtime of a job directory and its step directories (a save touches those)."""
    newest = path.stat().st_mtime
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest
