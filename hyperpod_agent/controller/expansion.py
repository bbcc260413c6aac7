"""Whether the controller may expand a running job on this cluster's slurmctld: the
step retry's merge of a spare (slurm/resize.py) crashes slurmctld 25.11 and 26.05
(slurm/version.py), so it runs only where the drills showed it safe.

The decision reads the version at most every RECHECK_S; the gate reads it again right
before each shrink and merge, so an upgrade between two reads is met
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
# A failed read is tried again this much sooner (it is refused meanwhile).
FAILED_RECHECK_S = 30.0
NOT_READ = "job expansion refused: slurmctld's version not read yet"


class VersionReader(Protocol):
    def slurmctld_version(self) -> str | None: ...


class ExpansionGuard:
    """slurmctld's version, and why expansion is refused there ("" when it is not)."""

    def __init__(self, slurm: VersionReader, clock: Callable[[], float] = time.time) -> None:
        self.slurm = slurm
        self.clock = clock
        self._read: tuple[float, float, str] | None = None  # (when read, valid for, refusal)
        self.version: str | None = None

    def refusal(self, fresh: bool = False) -> str:
        """Why no running job may be expanded now ("" when allowed). ``fresh``: read
        slurmctld's version now, not from the last RECHECK_S (FAILED_RECHECK_S after a
        failed read: unknown is refused, and each read costs an ``scontrol``)."""
        now = self.clock()
        if not fresh and self._read is not None and now - self._read[0] < self._read[1]:
            return self._read[2]
        try:
            version = self.slurm.slurmctld_version()
        except SlurmError as exc:
            version, valid = None, FAILED_RECHECK_S
            why = f"job expansion refused: slurmctld's version could not be read ({exc})"
        else:
            valid, why = RECHECK_S, expansion_refusal(version)
        if self._read is None or self._read[2] != why:  # logged when it changes only
            level = logging.WARNING if why and version is None else logging.INFO
            log.log(level, "slurmctld %s: %s", version or "?", why or "job expansion allowed")
        self.version, self._read = version, (now, valid, why)
        return why

    def known(self) -> str:
        """The last answer, without reading Slurm (for the API: no request waits on
        an ``scontrol``)."""
        return NOT_READ if self._read is None else self._read[2]
