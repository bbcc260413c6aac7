"""The agent removes the progress directories of jobs whose ranks are all gone, and
nothing else."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from progress_records import dead_pid, encode, record, write

from hyperpod_agent.agent.progress_janitor import ProgressJanitor

HOUR = 3600.0


def age(path: Path, seconds: float) -> Path:
    """Make ``path`` (and, for a directory, what is in it) look ``seconds`` old."""
    then = time.time() - seconds
    if path.is_dir() and not path.is_symlink():
        for entry in path.iterdir():
            os.utime(entry, (then, then), follow_symlinks=False)
    os.utime(path, (then, then), follow_symlinks=False)
    return path


def old_job(root: Path, job: int, pid: int, ranks: int = 2) -> Path:
    """A job directory whose records are 2 h old (created and last step)."""
    then = time.time() - 2 * HOUR
    for rank in range(ranks):
        record(root, pid, job, rank, created_at=then, step=10, step_at=then)
    return age(root / str(job), 2 * HOUR)


def test_directories_of_gone_and_stale_jobs_go(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    gone = dead_pid()
    stale = old_job(tmp_path, 101, gone)
    alive = old_job(tmp_path, 102, sleeper.pid)  # idle for hours, but its process lives
    mixed = old_job(tmp_path, 103, gone)
    record(tmp_path, sleeper.pid, 103, 5, created_at=time.time() - 2 * HOUR)
    age(mixed, 2 * HOUR)
    recent = old_job(tmp_path, 104, gone)
    record(tmp_path, gone, 104, 0, step=11, step_at=time.time() - 60)  # stepped a minute ago
    age(recent, 2 * HOUR)
    janitor = ProgressJanitor(tmp_path, stale_s=HOUR)
    assert janitor.sweep() == [101]
    assert not stale.exists()
    assert alive.exists() and mixed.exists() and recent.exists()


def test_a_freshly_changed_directory_is_not_even_read(tmp_path: Path) -> None:
    gone = dead_pid()
    d = old_job(tmp_path, 101, gone)
    os.utime(d)  # a rank's file was just created or removed
    assert ProgressJanitor(tmp_path, stale_s=HOUR).sweep() == []
    assert d.exists()


def test_old_unreadable_records_go_with_their_directory(tmp_path: Path) -> None:
    d = tmp_path / "101"
    write(tmp_path, 101, 0, b"\0" * 1024)  # created, never initialised
    write(tmp_path, 101, 1, encode(dead_pid(), 101, 1, seq=3))  # a write never finished
    age(d, 2 * HOUR)
    assert ProgressJanitor(tmp_path, stale_s=HOUR).sweep() == [101]
    assert not d.exists()


def test_symlinks_and_foreign_entries_are_never_followed_or_removed(tmp_path: Path) -> None:
    root, outside = tmp_path / "progress", tmp_path / "outside"
    root.mkdir()
    gone = dead_pid()
    target = old_job(outside, 101, gone)
    os.symlink(target, root / "101")  # a job directory that is a link
    age(root / "101", 2 * HOUR)
    linked = old_job(root, 102, gone)
    os.symlink(target / "0.prog", linked / "5.prog")  # a record that is a link
    age(linked, 2 * HOUR)
    extra = old_job(root, 103, gone)
    (extra / "notes.txt").write_text("not a record")
    age(extra, 2 * HOUR)
    (root / "other").mkdir()
    age(root / "other", 2 * HOUR)
    assert ProgressJanitor(root, stale_s=HOUR).sweep() == []
    assert (root / "101").is_symlink() and (target / "0.prog").exists()
    assert (linked / "0.prog").exists() and (linked / "5.prog").is_symlink()
    assert (extra / "0.prog").exists() and (root / "other").exists()


def test_work_per_sweep_is_bounded(tmp_path: Path) -> None:
    gone = dead_pid()
    for job in range(1, 41):
        old_job(tmp_path, job, gone, ranks=1)
    janitor = ProgressJanitor(tmp_path, stale_s=HOUR, max_dirs=32)
    first = janitor.sweep()
    assert len(first) == 32
    second = janitor.sweep()
    assert sorted(first + second) == list(range(1, 41))
    assert list(tmp_path.iterdir()) == []


def test_sweeps_are_spaced(tmp_path: Path) -> None:
    gone = dead_pid()
    janitor = ProgressJanitor(tmp_path, stale_s=HOUR, every_s=3600)
    old_job(tmp_path, 1, gone)
    assert janitor.maybe_sweep() == [1]
    old_job(tmp_path, 2, gone)
    assert janitor.maybe_sweep() == []  # not due yet
    assert (tmp_path / "2").exists()


def test_missing_root_and_errors_never_raise(tmp_path: Path) -> None:
    assert ProgressJanitor(tmp_path / "absent", stale_s=HOUR).maybe_sweep() == []
