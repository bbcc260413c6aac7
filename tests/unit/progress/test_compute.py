"""A rank's compute time, recorded apart from its step time: ``progress.step(n,
compute_s=...)`` and ``with progress.section("compute"):``. In a synchronous job every
rank's step takes as long as the slowest rank's (they wait for each other in the
collective), so only the time a rank spends computing tells which one is slow.

The figure lives where the first layout kept nothing (the reserved word after the
duration count, and bytes past the ring): a record that carries it decodes, for a
reader of the first layout, to exactly what it would without it."""

from __future__ import annotations

import logging
import math
import struct
from pathlib import Path

import pytest

from hyperpod_agent import progress
from hyperpod_agent.progress import format as fmt
from hyperpod_agent.progress import writer

from .conftest import read

SLACK = 1e-5  # float32


class Clock:
    """time.monotonic for the writer, moved by hand: durations become exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(writer, "_monotonic", c)
    return c


def test_compute_time_is_recorded_beside_the_step_time(job: Path, clock: Clock) -> None:
    progress.step(1, compute_s=0.5)  # the first step has no duration, so no compute time
    for n in range(2, 6):
        clock.now += 1.0
        progress.step(n, compute_s=0.25 * n)
    rec = read(job)
    assert rec.durations == (1.0, 1.0, 1.0, 1.0)
    assert rec.compute == pytest.approx((0.5, 0.75, 1.0, 1.25), abs=SLACK)
    assert rec.compute_total == 4


def test_a_record_without_compute_time_has_none(job: Path, clock: Clock) -> None:
    for n in range(1, 4):
        clock.now += 1.0
        progress.step(n)
    rec = read(job)
    assert rec.durations == (1.0, 1.0) and rec.compute == () and rec.compute_total == 0


def test_sections_add_up_to_the_steps_compute_time(job: Path, clock: Clock) -> None:
    progress.step(0)
    with progress.section("compute"):  # forward
        clock.now += 0.2
    clock.now += 0.5  # the all-reduce: not compute
    with progress.section("compute"):  # optimizer step
        clock.now += 0.1
    progress.step(1)
    clock.now += 1.0  # a step with no section: no compute time, shown as NaN
    progress.step(2)
    with progress.section("compute"):
        clock.now += 0.3
    progress.step(3)
    rec = read(job)
    assert rec.durations == pytest.approx((0.8, 1.0, 0.3), abs=SLACK)
    assert rec.compute[0] == pytest.approx(0.3, abs=SLACK) and math.isnan(rec.compute[1])
    assert rec.compute[2] == pytest.approx(0.3, abs=SLACK)
    assert rec.compute_total == 2


def test_compute_given_and_sections_add(job: Path, clock: Clock) -> None:
    progress.step(0)
    with progress.section("compute"):
        clock.now += 0.25
    clock.now += 0.75
    progress.step(1, compute_s=0.5)
    assert read(job).compute == pytest.approx((0.75,), abs=SLACK)


def test_a_section_that_raises_still_counts(job: Path, clock: Clock) -> None:
    progress.step(0)
    with pytest.raises(RuntimeError), progress.section("compute"):
        clock.now += 0.4
        raise RuntimeError("out of memory")
    progress.step(1)
    assert read(job).compute == pytest.approx((0.4,), abs=SLACK)


def test_compute_started_mid_run_shows_no_zeros_for_the_steps_before(
    job: Path, clock: Clock
) -> None:
    for n in range(1, 11):
        clock.now += 1.0
        progress.step(n)
    clock.now += 1.0
    progress.step(11, compute_s=0.5)
    rec = read(job)
    assert len(rec.compute) == len(rec.durations) == 10
    assert all(math.isnan(c) for c in rec.compute[:-1]) and rec.compute[-1] == 0.5


def test_the_compute_ring_keeps_the_latest(job: Path, clock: Clock) -> None:
    total = fmt.COMPUTE_RING * 3 + 5
    progress.step(0)
    for n in range(1, total + 1):
        clock.now += 1.0
        progress.step(n, compute_s=float(n))
    rec = read(job)
    assert len(rec.durations) == fmt.RING and rec.compute_total == total
    assert rec.compute == tuple(float(n) for n in range(total - fmt.COMPUTE_RING + 1, total + 1))


def test_bad_compute_times_are_ignored_once_and_the_step_recorded(
    job: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    progress.step(0)
    with caplog.at_level(logging.WARNING, logger="hyperpod_agent.progress"):
        for n, bad in enumerate((float("nan"), -1.0, "0.5", float("inf"), True), start=1):
            clock.now += 1.0
            progress.step(n, compute_s=bad)  # type: ignore[arg-type]
    rec = read(job)
    assert rec.step == 5 and len(rec.durations) == 5 and rec.compute == ()
    assert caplog.text.count("compute_s") == 1


def test_an_unknown_section_is_logged_once_and_times_nothing(
    job: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    progress.step(0)
    with caplog.at_level(logging.WARNING, logger="hyperpod_agent.progress"):
        for _ in range(3):
            with progress.section("comms"):
                clock.now += 0.5
    progress.step(1)
    assert read(job).compute == ()
    assert caplog.text.count("section('comms')") == 1


def test_outside_a_job_sections_and_compute_do_nothing(root: Path) -> None:
    with progress.section("compute"):
        pass
    progress.step(1, compute_s=0.5)
    assert progress.path() is None and not root.exists()


# -- the first layout's readers ------------------------------------------------------
def first_layout(data: bytes) -> fmt.Record:
    """Decode as a reader of the first layout does: it never looks at the reserved word
    or past the ring, so zero them (what the first writer left there) and decode."""
    blank = bytearray(data)
    blank[fmt.COMPUTE_TOTAL_OFFSET : fmt.COMPUTE_TOTAL_OFFSET + 4] = bytes(4)
    blank[fmt.RING_OFFSET + fmt.RING_STRUCT.size :] = bytes(
        fmt.SIZE - fmt.RING_OFFSET - fmt.RING_STRUCT.size
    )
    return fmt.decode(bytes(blank))


def test_the_new_figure_is_where_the_first_layout_reads_nothing(job: Path, clock: Clock) -> None:
    progress.step(0)
    for n in range(1, 40):
        clock.now += 1.0
        progress.step(n, compute_s=0.5)
    data = job.read_bytes()
    new, old = fmt.decode(data), first_layout(data)
    assert struct.unpack_from("<I", data, 8) == (fmt.VERSION,) == (1,), "same version"
    assert old.compute == () and old.compute_total == 0
    assert {**vars(new), "compute": (), "compute_total": 0} == vars(old)
    assert fmt.COMPUTE_TOTAL_OFFSET == 148, "the first layout's reserved word"
    assert fmt.COMPUTE_RING_OFFSET >= fmt.RING_OFFSET + fmt.RING_STRUCT.size
    assert fmt.COMPUTE_RING_OFFSET + fmt.COMPUTE_RING_STRUCT.size <= fmt.SIZE


def test_a_record_of_the_first_writer_has_no_compute_time(job: Path, clock: Clock) -> None:
    progress.step(0)
    for n in range(1, 5):
        clock.now += 1.0
        progress.step(n)
    rec = first_layout(job.read_bytes())
    assert rec.compute == () and rec.durations == (1.0, 1.0, 1.0, 1.0)
