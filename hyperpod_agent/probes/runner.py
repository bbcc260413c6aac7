"""Runs probes on their own cadence, each run in its own thread with a timeout.

A probe that raises or overruns its timeout yields UNKNOWN with the reason, never
FAIL. A hung probe cannot block the others: its thread is left behind (Python cannot
kill a thread), its next runs are skipped and reported UNKNOWN "still running after
Xs" until it returns, and a result it produces after its timeout is discarded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from hyperpod_agent.health import ProbeResult, Status
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig

log = logging.getLogger(__name__)

# Called for every result with whether the probe *ran* (no exception, no timeout).
Observer = Callable[[ProbeResult, bool], None]


def _now_utc() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Slot:
    name: str
    probe: Probe[ProbeConfig]
    next_due: float = 0.0
    thread: threading.Thread | None = None
    started: float = 0.0
    started_at: datetime | None = None
    run_id: int = 0
    timed_out: bool = False
    done: tuple[ProbeResult, bool] | None = None

    @property
    def config(self) -> ProbeConfig:
        return self.probe.config

    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


def _result(
    name: str, status: Status, message: str, at: datetime, duration: float, outcome: Outcome | None
) -> ProbeResult:
    return ProbeResult(
        probe=name,
        status=status,
        message=message[:1024],
        findings=list(outcome.findings) if outcome else [],
        duration_s=round(duration, 6),
        at=at,
    )


class ProbeRunner:
    """Schedules ``probes`` (name -> probe; only the enabled ones)."""

    def __init__(
        self,
        probes: Mapping[str, Probe[ProbeConfig]],
        observer: Observer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slots = {name: _Slot(name, probe) for name, probe in probes.items()}
        self._observer = observer
        self._clock = clock
        self._cond = threading.Condition()
        self.latest: dict[str, ProbeResult] = {}

    @property
    def names(self) -> list[str]:
        return list(self._slots)

    def next_due(self) -> float:
        """Monotonic time at which the next probe is due (inf with no probes)."""
        return min((s.next_due for s in self._slots.values()), default=float("inf"))

    # -- one run -------------------------------------------------------------------
    def _run(self, slot: _Slot, run_id: int) -> None:
        t0 = self._clock()
        at = slot.started_at or _now_utc()
        try:
            outcome = slot.probe.check()
            if not isinstance(outcome, Outcome):
                raise TypeError(f"check() returned {type(outcome).__name__}, not Outcome")
            res = _result(
                slot.name, outcome.status, outcome.message, at, self._clock() - t0, outcome
            )
            ok = True
        except Exception as exc:  # noqa: BLE001 - any probe bug must become UNKNOWN
            log.debug("probe %s raised", slot.name, exc_info=True)
            res = _result(
                slot.name,
                Status.UNKNOWN,
                f"probe raised {type(exc).__name__}: {exc}",
                at,
                self._clock() - t0,
                None,
            )
            ok = False
        with self._cond:
            if slot.run_id == run_id and not slot.timed_out:
                slot.done = (res, ok)
            self._cond.notify_all()

    def _start(self, slot: _Slot, now: float) -> None:
        slot.run_id += 1
        slot.started = now
        slot.started_at = _now_utc()
        slot.timed_out = False
        slot.done = None
        slot.thread = threading.Thread(
            target=self._run, args=(slot, slot.run_id), name=f"probe-{slot.name}", daemon=True
        )
        slot.thread.start()

    def _emit(self, res: ProbeResult, ok: bool, out: list[ProbeResult]) -> None:
        self.latest[res.probe] = res
        out.append(res)
        if self._observer is not None:
            self._observer(res, ok)

    # -- scheduling ----------------------------------------------------------------
    def start_due(self, now: float | None = None, force: bool = False) -> list[ProbeResult]:
        """Start every probe that is due (all with ``force``). A probe still running
        at its due time is skipped and reported UNKNOWN."""
        now = self._clock() if now is None else now
        out: list[ProbeResult] = []
        with self._cond:
            for slot in self._slots.values():
                interval = slot.config.interval_s
                # A little slack so a cycle waking a hair early does not skip a period.
                if not force and slot.next_due > now + min(0.1 * interval, 0.25):
                    continue
                # Keep the cadence; after a stall, restart it from now instead of bursting.
                slot.next_due += interval
                if slot.next_due <= now:
                    slot.next_due = now + interval
                if slot.running():
                    msg = f"still running after {now - slot.started:.1f}s; run skipped"
                    self._emit(
                        _result(slot.name, Status.UNKNOWN, msg, _now_utc(), 0.0, None), False, out
                    )
                    continue
                self._start(slot, now)
        return out

    def collect(self, now: float | None = None) -> list[ProbeResult]:
        """Results finished since the last call, plus an UNKNOWN for each run that just
        passed its timeout."""
        now = self._clock() if now is None else now
        out: list[ProbeResult] = []
        with self._cond:
            for slot in self._slots.values():
                if slot.done is not None:
                    res, ok = slot.done
                    slot.done = None
                    self._emit(res, ok, out)
                elif (
                    slot.running()
                    and not slot.timed_out
                    and now - slot.started >= slot.config.timeout_s
                ):
                    slot.timed_out = True
                    msg = f"timed out after {slot.config.timeout_s:g}s"
                    log.warning("probe %s %s", slot.name, msg)
                    at = slot.started_at or _now_utc()
                    self._emit(
                        _result(slot.name, Status.UNKNOWN, msg, at, now - slot.started, None),
                        False,
                        out,
                    )
        return out

    def _pending_deadline(self, now: float) -> float | None:
        """Earliest timeout among runs that have neither finished nor passed it."""
        deadlines = [
            s.started + s.config.timeout_s
            for s in self._slots.values()
            if s.running()
            and not s.timed_out
            and s.done is None
            and s.started + s.config.timeout_s > now
        ]
        return min(deadlines, default=None)

    def wait(self, until: float) -> None:
        """Block until every started run finished or passed its timeout, or until
        ``until``, whichever comes first."""
        with self._cond:
            while True:
                now = self._clock()
                pending = self._pending_deadline(now)
                if pending is None or now >= until:
                    return
                self._cond.wait(max(0.0, min(until, pending) - now))

    def cycle(self, max_wait: float) -> list[ProbeResult]:
        """Start due probes, wait up to ``max_wait`` s for them, return new results."""
        out = self.start_due()
        self.wait(self._clock() + max_wait)
        return out + self.collect()

    def run_once(self) -> list[ProbeResult]:
        """Run every probe now and wait for each (up to its timeout); for the CLI."""
        self.start_due(force=True)
        longest = max((s.config.timeout_s for s in self._slots.values()), default=0.0)
        self.wait(self._clock() + longest + 0.5)
        return self.collect()

    def close(self) -> None:
        """Close every probe; a probe that raises on close is logged, not fatal."""
        for slot in self._slots.values():
            try:
                slot.probe.close()
            except Exception:  # noqa: BLE001 - shutting down: report and go on
                log.warning("probe %s failed to close", slot.name, exc_info=True)
