"""A save in flight, and how many CPUs the process may use for its background work."""

from __future__ import annotations

import os
from concurrent.futures import Future

from hyperpod_agent.checkpoint.errors import CheckpointError


def spare_cpus() -> bool:
    """True when the process may run on 4 or more CPUs (room for writers beside training)."""
    try:
        return len(os.sched_getaffinity(0)) >= 4
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return (os.cpu_count() or 1) >= 4


class SaveHandle:
    """A save in flight: staged in memory, durable writes still running."""

    def __init__(self, step: int, future: Future[dict[str, str]], times: dict[str, float]):
        self.step = step
        self._future = future
        self._times = times

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds from the save call until each finished tier was durable."""
        return {k: v for k, v in self._times.items() if k != "start"}

    def done(self) -> bool:
        """True once every tier of this save has finished (well or not)."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> dict[str, str]:
        """Block until durable; return tier -> "ok". Raise CheckpointError if a tier failed."""
        tiers = self._future.result(timeout)
        failed = {t: s for t, s in tiers.items() if s != "ok"}
        if failed:
            raise CheckpointError(
                f"step {self.step}: "
                + "; ".join(f"{t} tier failed: {s}" for t, s in failed.items())
            )
        return tiers
