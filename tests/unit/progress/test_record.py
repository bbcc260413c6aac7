"""What ``progress.step``/``pause``/``resume`` write, decoded exactly as the agent decodes it."""

from __future__ import annotations

import itertools
import logging
import os
import stat
import time
from pathlib import Path

import pytest

from hyperpod_agent import progress
from hyperpod_agent.progress import format as fmt

from .conftest import JOB, RANK, read

SLACK = 1e-5  # float32 durations: 24 bits of mantissa


def timed_step(n: int) -> tuple[float, float]:
    """(monotonic before, after) a call of progress.step(n)."""
    t0 = time.monotonic()
    progress.step(n)
    return t0, time.monotonic()


def test_a_step_is_recorded_with_who_and_when(job: Path) -> None:
    before = time.time()
    progress.step(1)
    after = time.time()
    rec = read(job)
    assert (rec.pid, rec.job_id, rec.rank) == (os.getpid(), JOB, RANK)
    assert rec.step == 1 and before <= rec.step_at <= after
    assert before - 60 <= rec.created_at <= rec.step_at
    assert (rec.paused, rec.pause_since, rec.pause_reason) == (False, 0.0, "")
    assert (rec.hang_factor, rec.hang_min_s) == (0.0, 0.0)
    assert rec.total == 0 and rec.durations == (), "the first step has no duration"


def test_the_file_the_root_and_the_job_directory(job: Path, root: Path) -> None:
    progress.step(1)
    assert progress.path() == job
    modes = {p: stat.S_IMODE(os.lstat(p).st_mode) for p in (root, job.parent, job)}
    assert modes == {root: 0o1777, job.parent: 0o755, job: 0o644}
    assert os.lstat(job).st_uid == os.geteuid() and job.stat().st_size == fmt.SIZE
    assert sorted(os.listdir(job.parent)) == [job.name], "no temporary file left"


def test_durations_are_the_time_between_steps(job: Path) -> None:
    marks = [timed_step(n) for n in range(1, 6)]
    rec = read(job)
    assert rec.step == 5 and rec.total == 4 and len(rec.durations) == 4
    for ((b0, a0), (b1, a1)), d in zip(itertools.pairwise(marks), rec.durations, strict=True):
        assert b1 - a0 - SLACK <= d <= a1 - b0 + SLACK


def test_the_ring_keeps_the_latest_durations_oldest_first(job: Path) -> None:
    steps = 300
    slow = {200: 0.02, 290: 0.04}  # marks at known places of the ring
    marks = []
    for n in range(1, steps + 1):
        if n in slow:
            time.sleep(slow[n])
        marks.append(timed_step(n))
    rec = read(job)
    assert rec.total == steps - 1 and len(rec.durations) == fmt.RING
    first = steps - fmt.RING + 1  # the step whose duration is the oldest kept
    for i, d in enumerate(rec.durations):
        (b0, a0), (b1, a1) = marks[first + i - 2], marks[first + i - 1]  # steps s-1 and s
        assert b1 - a0 - SLACK <= d <= a1 - b0 + SLACK, i
    assert rec.durations[200 - first] >= 0.02 and rec.durations[290 - first] >= 0.04


def test_a_step_that_does_not_grow_is_recorded_without_duration(job: Path) -> None:
    for n in (10, 11):
        progress.step(n)
    progress.step(5)  # restarted from a checkpoint
    rec = read(job)
    assert (rec.step, rec.total) == (5, 1)
    progress.step(5)
    assert (read(job).step, read(job).total) == (5, 1)
    progress.step(6)
    rec = read(job)
    assert (rec.step, rec.total) == (6, 2)


def test_pause_and_resume(job: Path) -> None:
    progress.step(1)
    before = time.time()
    progress.pause("evaluation")
    after = time.time()
    rec = read(job)
    assert rec.paused and rec.pause_reason == "evaluation"
    assert before <= rec.pause_since <= after
    assert rec.step == 1, "a pause records no step"
    before = time.time()
    progress.resume()
    after = time.time()
    rec = read(job)
    assert (rec.paused, rec.pause_reason) == (False, "")
    # The end of the phase: a hang's clock restarts there, not at the step before it.
    assert before <= rec.pause_since <= after


def test_pauses_nest_and_only_the_outermost_resume_unpauses(job: Path) -> None:
    progress.pause("evaluation")
    since = read(job).pause_since
    with progress.paused("checkpoint save"):
        rec = read(job)
        assert rec.paused and rec.pause_reason == "checkpoint save"
        assert rec.pause_since == since, "the phase started with the outer pause"
    rec = read(job)
    assert rec.paused and rec.pause_reason == "evaluation" and rec.pause_since == since
    progress.resume()
    assert not read(job).paused


def test_paused_resumes_when_its_block_raises(job: Path) -> None:
    with pytest.raises(RuntimeError), progress.paused("data re-shard"):
        assert read(job).paused
        raise RuntimeError("boom")
    assert not read(job).paused


def test_a_resume_without_pause_is_ignored(job: Path, caplog: pytest.LogCaptureFixture) -> None:
    progress.step(1)
    with caplog.at_level(logging.WARNING, logger="hyperpod_agent.progress"):
        progress.resume()
        progress.resume()
    assert not read(job).paused
    assert caplog.text.count("resume() without pause()") == 1
    with progress.paused("evaluation"):
        assert read(job).paused, "the depth did not go below zero"


def test_pause_reasons_are_ascii_and_bounded(job: Path) -> None:
    progress.pause("évaluation ✓ done")
    assert read(job).pause_reason == "?valuation ? done"
    progress.resume()
    progress.pause("x" * 100)
    assert read(job).pause_reason == "x" * fmt.REASON_LEN
    progress.resume()
    progress.pause("tab\there\x00nul")
    assert read(job).pause_reason == "tab?here?nul"


def test_paused_time_is_not_part_of_a_duration(job: Path) -> None:
    b0, a0 = timed_step(1)
    p0 = time.monotonic()
    with progress.paused("evaluation"):
        p1 = time.monotonic()
        time.sleep(0.05)
        r0 = time.monotonic()
    r1 = time.monotonic()
    b1, a1 = timed_step(2)
    (d,) = read(job).durations
    # The step's own time: from the previous step to this one, less the paused phase.
    assert (b1 - a0) - (r1 - p0) - SLACK <= d <= (a1 - b0) - (r0 - p1) + SLACK
    assert d < 0.05


def test_a_step_inside_a_pause_has_no_duration(job: Path) -> None:
    progress.step(1)
    with progress.paused("evaluation"):
        progress.step(2)
    assert (read(job).step, read(job).total) == (2, 0)
    progress.step(3)
    assert read(job).total == 1


def test_hang_overrides_from_the_environment(job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERPOD_HANG_FACTOR", "3.5")
    monkeypatch.setenv("HYPERPOD_HANG_MIN_S", "600")
    progress.step(1)
    rec = read(job)
    assert (rec.hang_factor, rec.hang_min_s) == (3.5, 600.0)


@pytest.mark.parametrize(
    "factor, floor",
    [("abc", "1e400"), ("-1", "0"), ("nan", "inf"), ("0", "-5"), ("1001", "1e8"), (" ", "x")],
)
def test_bad_hang_overrides_are_ignored_with_one_warning_each(
    job: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    factor: str,
    floor: str,
) -> None:
    monkeypatch.setenv("HYPERPOD_HANG_FACTOR", factor)
    monkeypatch.setenv("HYPERPOD_HANG_MIN_S", floor)
    with caplog.at_level(logging.WARNING, logger="hyperpod_agent.progress"):
        for n in range(3):
            progress.step(n)
    rec = read(job)
    assert (rec.step, rec.hang_factor, rec.hang_min_s) == (2, 0.0, 0.0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert f"HYPERPOD_HANG_FACTOR={factor!r}" in lines[0]
    assert f"HYPERPOD_HANG_MIN_S={floor!r}" in lines[1]


def test_one_override_alone(job: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERPOD_HANG_MIN_S", "45.5")
    monkeypatch.setenv("HYPERPOD_HANG_FACTOR", "")
    progress.step(1)
    assert (read(job).hang_factor, read(job).hang_min_s) == (0.0, 45.5)


@pytest.mark.parametrize("bad", [-1, 2**62 + 1, 2**70, 1.5, "7", None, True])
def test_a_bad_step_number_is_ignored_and_logged_once(
    job: Path, caplog: pytest.LogCaptureFixture, bad: object
) -> None:
    progress.step(4)
    with caplog.at_level(logging.WARNING, logger="hyperpod_agent.progress"):
        for _ in range(3):
            progress.step(bad)  # type: ignore[arg-type]
    rec = read(job)  # whole: seq even, nothing half-written
    assert (rec.step, rec.total) == (4, 0)
    assert len(caplog.records) == 1 and "step" in caplog.records[0].getMessage()
    progress.step(5)
    assert read(job).step == 5, "recording goes on"


def test_numpy_integers_are_steps(job: Path) -> None:
    np = pytest.importorskip("numpy")
    progress.step(np.int64(7))
    assert read(job).step == 7


def test_the_rank_is_torchruns_when_it_sets_one(
    job: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "17")  # torchrun's global rank; SLURM_PROCID is the task's
    progress.step(1)
    path = fmt.record_path(root, JOB, 17)
    assert progress.path() == path and read(path).rank == 17 and not job.exists()


def test_a_new_process_starts_a_fresh_record(job: Path) -> None:
    progress.step(50)
    old = os.stat(job).st_ino
    progress.close()  # as the process of an earlier attempt would have at exit
    assert read(job).step == 50, "close leaves the record for the agent"
    progress.step(1)  # the next attempt (a requeue onto the same node)
    rec = read(job)
    assert (rec.step, rec.total) == (1, 0) and os.stat(job).st_ino != old


def test_steps_after_close_start_again(job: Path) -> None:
    progress.step(1)
    progress.close()
    progress.close()
    progress.pause("evaluation")
    assert read(job).paused
