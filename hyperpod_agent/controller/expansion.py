"""Whether the controller may expand a running job on this cluster's slurmctld: the
step retry's merge of a spare (slurm/resize.py) crashes slurmctld 25.11 and 26.05
(slurm/version.py), so it runs only where the drills showed it safe.

The decision reads the version at most every RECHECK_S; the gate reads it again right
before each shrink, allocation and merge, so an upgrade between two reads is met
there (the surgery then rolls back to the job-level requeue).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from hyperpod_agent.errors import SlurmError
from hyperpod_agent.slurm.version import expansion_refusal

log = logging.getLogger(__name__)

RECHECK_S = 300.0


class VersionReader(Protocol):
    def slurmctld_version(self) -> str | None: ...


class ExpansionGuard:
    """slurmctld's version, and why expansion is refused there ("" when it is not)."""

    def __init__(self, slurm: VersionReader, clock: Callable[[], float] = time.time) -> None:
        self.slurm = slurm
        self.clock = clock
        self._read: tuple[float, str] | None = None  # (when read, refusal)
        self.version: str | None = None

    def refusal(self, fresh: bool = False) -> str:
        """Why no running job may be expanded now ("" when allowed). ``fresh``: read
        slurmctld's version now, not from the last RECHECK_S."""
        now = self.clock()
        if not fresh and self._read is not None and now - self._read[0] < RECHECK_S:
            return self._read[1]
        try:
            version = self.slurm.slurmctld_version()
        except SlurmError as exc:
            # Unknown is refused, and read again next time (not cached).
            log.warning("reading slurmctld's version failed: %s", exc)
            return f"job expansion refused: slurmctld's version could not be read ({exc})"
        why = expansion_refusal(version)
        if self._read is None or self._read[1] != why:
            log.info("slurmctld %s: %s", version, why or "job expansion allowed (shown safe)")
        self.version, self._read = version, (now, why)
        return why
