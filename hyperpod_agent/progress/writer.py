"""This rank's training progress, recorded for the node's agent to read.

    from hyperpod_agent import progress

    for step in range(start, total_steps):
        train_one_step()
        progress.step(step)          # about a microsecond, no system call, never raises
    with progress.paused("evaluation"):
        evaluate()                   # a phase without steps is not a hang

In a synchronous job (DDP), wrap what a rank computes, not its collectives, in
``with progress.section("compute"):`` (or pass ``progress.step(n, compute_s=...)``): the
controller tells a straggler by that time, as every rank's step takes the slowest's.

The record is ``<root>/<SLURM_JOB_ID>/<rank>.prog`` (progress/format.py has the layout),
made on the first call and then updated in place through a shared mapping under a
seqlock. Outside a Slurm job, or when the record cannot be made safely, every call does
nothing; one log line says why. docs/progress.md tells what the agent and the controller
do with it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import mmap
import operator
import os
import re
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from hyperpod_agent.progress import format as fmt
from hyperpod_agent.progress import record

# The library's public logger is the package's name, wherever the code sits inside it.
log = logging.getLogger("hyperpod_agent.progress")

FACTOR_ENV, MIN_S_ENV = "HYPERPOD_HANG_FACTOR", "HYPERPOD_HANG_MIN_S"
MAX_STEP = 2**62  # the bounds of the report models (health.RankProgress, JobProgress)
MAX_JOB_ID, MAX_RANK = 2**32 - 1, 10_000_000
MAX_FACTOR, MAX_MIN_S = 1000.0, 1e7
_DIGITS = re.compile(r"[0-9]{1,10}", re.ASCII)  # not isdigit(): it takes digits int() refuses
_MASK = 0xFFFFFFFF  # seq and total are uint32
_TOTAL_WRAP = _MASK + 1 - fmt.RING  # subtracted past 2**32 - 1: same ring slot, still >= RING
# Any byte outside printable ASCII becomes "?": the reason reaches logs and reports.
_PRINTABLE = bytes(c if 0x20 <= c < 0x7F else 0x3F for c in range(256))

# The parts of STATE (paused I, created d, step q, step_at d, pause_since d, reason 56s, ...)
# that change, each written with one pack_into.
_PAUSED, _PAUSED_AT = struct.Struct("<I"), fmt.STATE_OFFSET
_STEP, _STEP_AT = struct.Struct("<qd"), fmt.STATE_OFFSET + struct.calcsize("<Id")
_PAUSE, _PAUSE_AT = struct.Struct(f"<d{fmt.REASON_LEN}s"), _STEP_AT + struct.calcsize("<qd")
_pack_step = _STEP.pack_into
_pack_duration, _pack_total = fmt.DURATION.pack_into, fmt.TOTAL.pack_into
_pack_compute, _pack_compute_total = fmt.COMPUTE.pack_into, fmt.COMPUTE_TOTAL.pack_into
_NO_COMPUTE = bytes(fmt.COMPUTE_RING_STRUCT.pack(*[math.nan] * fmt.COMPUTE_RING))
MAX_COMPUTE_S = 7 * 86400.0  # a compute time beyond a week is not one
COMPUTE = "compute"  # the one section the record keeps
_monotonic, _time = time.monotonic, time.time


class _Writer:
    """One mapped record, written by this process only."""

    def __init__(self, mapped: mmap.mmap, path: Path) -> None:
        self.map, self.path = mapped, path
        # seq is stored through a typed view: one aligned 4-byte store. struct's
        # pack_into zeroes its bytes before it writes them, and a reader that meets
        # that passing 0 takes it for an even (finished) sequence number.
        self.seq_view = memoryview(mapped)[fmt.SEQ_OFFSET : fmt.SEQ_OFFSET + fmt.SEQ.size].cast("I")
        self.lock = threading.Lock()  # a write is several stores: one thread at a time
        self.seq = 0
        self.step = -1
        self.total = 0
        # When the next step's duration starts (monotonic s; < 0: it has none): the last
        # step, moved forward by the time paused since, so a duration is active time.
        self.since_step = -1.0
        self.pause_t0 = 0.0
        self.pause_at = 0.0
        self.reasons: list[bytes] = []  # innermost last
        # Compute time of the step under way: what sections measured so far, and
        # whether any did (a step with a section of 0 s still has a compute time).
        self.computed, self.in_section = 0.0, False
        self.compute_total = 0  # steps recorded with a compute time (0: ring unused)

    def record(self, n: int, compute_s: float | None = None) -> None:
        if isinstance(n, bool):
            raise TypeError("a bool is not a step")
        n = operator.index(n)  # NumPy integers too; a float or a str raises
        if not 0 <= n <= MAX_STEP:
            raise ValueError(f"step {n} is outside 0..2**62")
        with self.lock:
            now = _monotonic()
            if self.in_section:
                compute_s = self.computed + (compute_s or 0.0)
                self.computed, self.in_section = 0.0, False
            m, seq, seq_view = self.map, self.seq, self.seq_view
            seq_view[0] = (seq + 1) & _MASK
            _pack_step(m, _STEP_AT, n, _time())
            if self.reasons:
                self.pause_t0 = now  # the rest of the phase does not count either
            elif n > self.step and self.since_step >= 0:
                total = self.total + 1
                if total > _MASK:
                    total -= _TOTAL_WRAP
                slot = fmt.RING_OFFSET + fmt.DURATION.size * ((total - 1) % fmt.RING)
                _pack_duration(m, slot, now - self.since_step)
                if compute_s is not None or self.compute_total:
                    self._write_compute(total, compute_s)
                _pack_total(m, fmt.TOTAL_OFFSET, total)
                self.total = total
            self.seq = (seq + 2) & _MASK
            seq_view[0] = self.seq
            self.step, self.since_step = n, now

    def _write_compute(self, total: int, compute_s: float | None) -> None:
        """The step's compute time beside its duration (NaN: none), inside a write."""
        m = self.map
        if not self.compute_total:  # first use: no slot may read as a 0 s compute
            m[fmt.COMPUTE_RING_OFFSET : fmt.COMPUTE_RING_OFFSET + len(_NO_COMPUTE)] = _NO_COMPUTE
        slot = fmt.COMPUTE_RING_OFFSET + fmt.COMPUTE.size * ((total - 1) % fmt.COMPUTE_RING)
        _pack_compute(m, slot, math.nan if compute_s is None else compute_s)
        if compute_s is not None:
            self.compute_total = (self.compute_total + 1) & _MASK or 1
            _pack_compute_total(m, fmt.COMPUTE_TOTAL_OFFSET, self.compute_total)

    def add_compute(self, seconds: float) -> None:
        with self.lock:
            self.computed += seconds
            self.in_section = True

    def pause(self, reason: str) -> None:
        text = str(reason).encode("ascii", "replace")[: fmt.REASON_LEN].translate(_PRINTABLE)
        with self.lock:
            if not self.reasons:
                self.pause_t0, self.pause_at = _monotonic(), _time()
            self.reasons.append(text)
            self._write_pause(1, self.pause_at, text)

    def resume(self) -> bool:
        with self.lock:
            if not self.reasons:
                return False
            self.reasons.pop()
            if self.reasons:
                self._write_pause(1, self.pause_at, self.reasons[-1])
                return True
            if self.since_step >= 0:
                self.since_step += _monotonic() - self.pause_t0
            # pause_since keeps when the phase ended: the clock of a hang restarts there.
            self._write_pause(0, _time(), b"")
            return True

    def _write_pause(self, paused: int, since: float, reason: bytes) -> None:
        m, seq = self.map, self.seq
        self.seq_view[0] = (seq + 1) & _MASK
        _PAUSED.pack_into(m, _PAUSED_AT, paused)
        _PAUSE.pack_into(m, _PAUSE_AT, since, reason)
        self.seq = (seq + 2) & _MASK
        self.seq_view[0] = self.seq

    def close(self) -> None:
        with self.lock:
            self.seq_view.release()  # the map cannot close while a view is exported
            self.map.close()


class _Off:
    """Not recording in this process: every call does nothing. ``final``: not even after
    close() (a forked child, or the interpreter exiting)."""

    path = None

    def __init__(self, final: bool = False) -> None:
        self.final = final

    def record(self, n: int, compute_s: float | None = None) -> None:
        pass

    def add_compute(self, seconds: float) -> None:
        pass

    def pause(self, reason: str) -> None:
        pass

    def resume(self) -> bool:
        return True

    def close(self) -> None:
        pass


_lock = threading.Lock()  # guards _active's changes, never a step
_active: _Writer | _Off | None = None  # None: not yet started
_said: set[str] = set()  # what was logged already


def step(n: int, compute_s: float | None = None) -> None:
    """Record that this rank finished step ``n`` (an int in 0..2**62) now.

    The time since the previous step, less any paused phase between, goes into the
    record's ring of durations; the first step of a process and a step that does not
    grow (a restart from a checkpoint) are recorded without one. ``compute_s``: the
    seconds of that step this rank spent computing, without waiting for other ranks
    in collectives (added to what ``section("compute")`` measured since the last
    step); in a synchronous job it is what tells a slow rank from the ranks waiting for
    it. Never raises: a bad ``n`` is logged once and ignored, a bad ``compute_s``
    (negative, not finite, not a number) is logged once and the step recorded without.
    """
    if compute_s is not None:
        compute_s = _compute_seconds(compute_s)
    try:
        (_active or _start()).record(n, compute_s)
    except Exception as exc:  # noqa: BLE001 - a training loop must not die of this
        _say_once("step", "progress.step(%r) ignored: %s", n, exc)


def _compute_seconds(value: object) -> float | None:
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        seconds = float(value)
        if 0.0 <= seconds <= MAX_COMPUTE_S:  # NaN fails too
            return seconds
    _say_once("compute", "progress.step(compute_s=%r) ignored: expected seconds >= 0", value)
    return None


@contextlib.contextmanager
def section(name: str) -> Iterator[None]:
    """``with progress.section("compute"):`` adds the block's time to this rank's
    compute time of the step under way, even if it raises (see ``step``). Wrap the
    forward and backward passes and the optimizer step, not the collectives: the time
    a rank waits for the others is what a straggler's peers spend, not the straggler.
    "compute" is the one section recorded; another name is logged once and times
    nothing. Never raises."""
    if name != COMPUTE:
        _say_once("section", "progress.section(%r) ignored: only 'compute' is recorded", name)
        yield
        return
    t0 = _monotonic()
    try:
        yield
    finally:
        try:
            (_active or _start()).add_compute(_monotonic() - t0)
        except Exception as exc:  # noqa: BLE001
            _say_once("section", "progress.section(%r) ignored: %s", name, exc)


def pause(reason: str) -> None:
    """Enter a phase without steps (evaluation, checkpoint save or load, data re-shard):
    no hang is judged while paused. ``reason`` is shown as ASCII, cut to 56 bytes.
    Pauses nest; see ``paused``. Never raises."""
    try:
        (_active or _start()).pause(reason)
    except Exception as exc:  # noqa: BLE001
        _say_once("pause", "progress.pause(%r) ignored: %s", reason, exc)


def resume() -> None:
    """Leave the innermost paused phase; the outermost one's end un-pauses. A resume
    without a pause is logged once and ignored. Never raises."""
    try:
        if not (_active or _start()).resume():
            _say_once("resume", "progress.resume() without pause(): ignored")
    except Exception as exc:  # noqa: BLE001
        _say_once("resume", "progress.resume() ignored: %s", exc)


@contextlib.contextmanager
def paused(reason: str) -> Iterator[None]:
    """``with progress.paused("evaluation"):`` pauses for the block, even if it raises."""
    pause(reason)
    try:
        yield
    finally:
        resume()


def path() -> Path | None:
    """The record this process writes, or None (not started, or not recording)."""
    return _active.path if _active is not None else None


def close() -> None:
    """Stop writing and leave the record for the agent (its janitor removes a job's
    directory once the job is over). A later call starts a fresh record. Never raises."""
    global _active
    with _lock:
        old = _active
        if not (isinstance(old, _Off) and old.final):
            _active = None
        _said.clear()
    if isinstance(old, _Writer):
        with contextlib.suppress(Exception):
            old.close()


@atexit.register
def _at_exit() -> None:
    global _active
    old, _active = _active, _Off(final=True)
    if isinstance(old, _Writer):
        with contextlib.suppress(Exception):
            old.close()


def _after_fork() -> None:
    # The parent's record is the parent's: a child that inherited it goes quiet for good.
    global _active, _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    if isinstance(_active, _Writer):
        _active = _Off(final=True)


os.register_at_fork(after_in_child=_after_fork)


def _say_once(kind: str, message: str, *args: object) -> None:
    if kind not in _said:
        _said.add(kind)
        log.warning(message, *args)


def _start() -> _Writer | _Off:
    global _active
    with _lock:
        if _active is None:
            _active = _open(os.environ)
        return _active


def _open(env: Mapping[str, str]) -> _Writer | _Off:
    if not env.get("SLURM_JOB_ID"):
        log.debug("progress: not in a Slurm job (no SLURM_JOB_ID): not recording")
        return _Off()
    try:
        job = _number(env, "SLURM_JOB_ID", 1, MAX_JOB_ID)
        rank = _number(env, "RANK" if env.get("RANK") else "SLURM_PROCID", 0, MAX_RANK)
    except ValueError as exc:
        log.warning("progress: not recording: %s", exc)
        return _Off()
    factor = _override(env, FACTOR_ENV, MAX_FACTOR)
    floor = _override(env, MIN_S_ENV, MAX_MIN_S)
    base = fmt.root()
    target = fmt.record_path(base, job, rank)
    try:
        mapped = record.create(base, target, record.initial(job, rank, factor, floor))
    except record.Refused as exc:
        log.warning("progress: not recording for job %d rank %d: %s", job, rank, exc)
        return _Off()
    return _Writer(mapped, target)


def _number(env: Mapping[str, str], name: str, low: int, high: int) -> int:
    raw = env.get(name, "")
    if not _DIGITS.fullmatch(raw) or not low <= int(raw) <= high:
        raise ValueError(f"{name}={raw!r}: expected an integer in {low}..{high}")
    return int(raw)


def _override(env: Mapping[str, str], name: str, high: float) -> float:
    """A per-job hang setting for the controller; 0 (the controller's own) if unset or bad."""
    raw = env.get(name, "")
    if raw == "":
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= high:  # NaN fails too
        log.warning(
            "progress: ignoring %s=%r: expected a number in (0, %g]; the controller's "
            "setting applies",
            name,
            raw,
            high,
        )
        return 0.0
    return value
