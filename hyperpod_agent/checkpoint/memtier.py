"""The directory of a run's memory tier: opened safely, held while the process lives.

``<job dir>/run-<namespace>/`` (identity.py), both checked to be ours and private
(perms.py). A process holds a shared lock on the run's ``.lock`` for its lifetime: the node
agent frees another run's directory only when nobody holds it. When the directory cannot
be used safely the run has no memory tier (one error line) and saves go to the other tiers.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from hyperpod_agent.checkpoint import identity, perms
from hyperpod_agent.checkpoint.errors import CheckpointStorageError
from hyperpod_agent.shared_root import LOCK_FILE

log = logging.getLogger(__name__)


class RunDir:
    """One process's hold on its run's memory-tier directory."""

    def __init__(
        self, job_dir: Path, run: identity.RunIdentity, persistent: Path | str, rank: int
    ) -> None:
        self.job_dir, self.run, self.persistent, self.rank = job_dir, run, persistent, rank
        self._lock = -1
        self.path: Path | None = job_dir / run.dir_name
        try:
            self._make()
        except CheckpointStorageError as exc:
            log.error("rank %d: no memory tier: %s", rank, exc)
            self.path = None

    def _make(self) -> None:
        assert self.path is not None
        perms.private_dir(self.job_dir, "memory tier")
        perms.private_dir(self.path, "memory tier")
        identity.record(self.path, self.run, self.persistent)
        self._hold()

    def _hold(self) -> None:
        assert self.path is not None
        self.release()
        try:
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            log.warning("memory tier %s: cannot lock: %s", self.path, exc)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError as exc:
            os.close(fd)
            log.warning("memory tier %s: cannot lock: %s", self.path, exc)
            return
        self._lock = fd

    def others(self) -> list[str]:
        """The other runs' directories in the job directory (logged once by the caller)."""
        return identity.other_runs(self.job_dir, self.run)

    def ensure(self) -> None:
        """Recreate the directory if it was wiped (an operator emptied /dev/shm); a save
        that then finds no directory reports its memory tier as failed."""
        if self.path is None or self.path.is_dir():
            return
        try:
            self._make()
        except CheckpointStorageError as exc:
            log.warning("rank %d: memory tier unavailable: %s", self.rank, exc)

    def release(self) -> None:
        """Let go of the lock (at close)."""
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1
