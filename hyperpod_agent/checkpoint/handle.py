"""A save in flight, and how many CPUs the process may use for its background work."""

from __future__ import annotations

import os
import time
from concurrent.futures import Future

from hyperpod_agent import progress
from hyperpod_agent.checkpoint.errors import CheckpointError


def spare_cpus() -> bool:
    """True when the process may run on 4 or more CPUs (room for writers beside training)."""
    try:
        return len(os.sched_getaffinity(0)) >= 4
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return (os.cpu_count() or 1) >= 4


SKIPPED = "skipped"  # the status of a tier a save did not write (see Checkpointer.save)


class SaveHandle:
    """A save in flight: staged in memory, durable writes still running.

    ``future`` is the save's work the next save waits for; ``uploads`` are object-store
    uploads that run on after it (the next save does not wait for them).
    """

    def __init__(
        self,
        step: int,
        future: Future[dict[str, str]],
        times: dict[str, float],
        uploads: list[Future[None]] | None = None,
    ):
        self.step = step
        self._future = future
        self._times = times
        self._uploads = uploads or []

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds from the save call until each finished tier was durable."""
        return {k: v for k, v in self._times.items() if k != "start"}

    def done(self) -> bool:
        """True once every tier of this save has finished (well or not)."""
        return self._future.done() and all(f.done() for f in self._uploads)

    def wait(self, timeout: float | None = None) -> dict[str, str]:
        """Block until durable; return tier -> "ok" (or "skipped: why" for a tier this save
        did not write). Raise CheckpointError if a tier failed. The wait is a paused
        phase of this rank's progress (hyperpod_agent.progress)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with progress.paused("checkpoint save"):
            tiers = self._future.result(timeout)
            for f in self._uploads:
                f.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
        tiers = dict(tiers)
        failed = {t: s for t, s in tiers.items() if s != "ok" and not s.startswith(SKIPPED)}
        if failed:
            raise CheckpointError(
                f"step {self.step}: "
                + "; ".join(f"{t} tier failed: {s}" for t, s in failed.items())
            )
        return tiers
