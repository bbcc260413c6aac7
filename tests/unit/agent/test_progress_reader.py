"""The agent reads training ranks' progress records: real files, real processes."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from progress_records import dead_pid, encode, proc_state, record, wait_until, write

from hyperpod_agent.agent import progress_files as pfiles
from hyperpod_agent.agent import progress_reader as pr
from hyperpod_agent.agent.progress_reader import ProgressReader
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.health import JobProgress, NodeReport, Verdict

HOUR = 3600.0
LOGGER = "hyperpod_agent.agent.progress_reader"


class Skips:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


def reader(root: Path, **kw: object) -> tuple[ProgressReader, Skips]:
    skips = Skips()
    return ProgressReader(root, on_skip=skips, **kw), skips  # type: ignore[arg-type]


def ranks(jobs: list[JobProgress]) -> dict[tuple[int, int], object]:
    return {(j.job_id, r.rank): r for j in jobs for r in j.ranks}


# -- reading records ----------------------------------------------------------------


def test_a_record_is_summarised(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    now = time.time()
    record(
        tmp_path,
        sleeper.pid,
        42,
        3,
        step=99,
        step_at=now - 1,
        created_at=now - 60,
        durations=[float(d) for d in range(1, 101)],
        hang_factor=4.0,
    )
    record(tmp_path, sleeper.pid, 42, 1, step=-1, created_at=now - 5, hang_factor=4.0)
    rd, skips = reader(tmp_path)
    jobs = rd.read()
    assert [j.job_id for j in jobs] == [42]
    job = jobs[0]
    assert job.hang_factor == 4.0 and job.hang_min_s is None
    assert [r.rank for r in job.ranks] == [1, 3]  # sorted by rank
    fresh, busy = job.ranks
    assert fresh.step == -1 and fresh.step_at is None and fresh.window == 0
    assert fresh.median_s is None and fresh.last_s is None
    assert busy.pid == sleeper.pid and busy.step == 99
    assert busy.step_at == pytest.approx(now - 1)
    assert (busy.window, busy.median_s, busy.p95_s, busy.last_s) == (100, 50.5, 95.0, 100.0)
    assert busy.proc_state == "S" and not busy.paused and busy.pause_since is None
    assert skips.reasons == []


def test_ring_wrap_keeps_the_newest_128(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    record(tmp_path, sleeper.pid, 7, 0, step=299, step_at=time.time(), durations=range(300))
    (job,) = reader(tmp_path)[0].read()
    (rank,) = job.ranks
    # The ring holds durations 172..299.
    assert rank.window == 128 and rank.last_s == 299.0
    assert rank.median_s == 235.5 and rank.p95_s == 293.0


def test_paused_phase(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    since = time.time() - 30
    record(tmp_path, sleeper.pid, 7, 0, paused=True, pause_since=since, reason=b"checkpoint")
    (job,) = reader(tmp_path)[0].read()
    (rank,) = job.ranks
    assert rank.paused and rank.pause_reason == "checkpoint"
    assert rank.pause_since == pytest.approx(since)


def test_stopped_process_shows_t(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    record(tmp_path, sleeper.pid, 7, 0)
    rd = reader(tmp_path)[0]
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_until(lambda: proc_state(sleeper.pid) == "T")
    assert rd.read()[0].ranks[0].proc_state == "T"
    os.kill(sleeper.pid, signal.SIGCONT)
    wait_until(lambda: proc_state(sleeper.pid) == "S")
    assert rd.read()[0].ranks[0].proc_state == "S"


def test_exited_unreaped_process_shows_z(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    try:
        wait_until(lambda: proc_state(proc.pid) == "Z")
        record(tmp_path, proc.pid, 7, 0)
        assert reader(tmp_path)[0].read()[0].ranks[0].proc_state == "Z"
    finally:
        proc.wait(10)


def test_dead_pid_is_gone_until_stale(tmp_path: Path) -> None:
    pid = dead_pid()
    long_ago = time.time() - 3 * HOUR
    record(tmp_path, pid, 7, 0, created_at=long_ago, step=5, step_at=time.time() - 10)
    record(tmp_path, pid, 8, 0, created_at=long_ago, step=5, step_at=time.time() - 2 * HOUR)
    rd, skips = reader(tmp_path, stale_s=HOUR)
    jobs = rd.read()
    assert [(j.job_id, j.ranks[0].proc_state) for j in jobs] == [(7, "gone")]
    assert skips.reasons == ["stale"]


def test_stale_counts_the_newest_of_created_and_step(tmp_path: Path) -> None:
    pid = dead_pid()
    # Created long ago, but its last step is recent: not stale.
    record(tmp_path, pid, 7, 0, created_at=time.time() - 5 * HOUR, step_at=time.time() - 60)
    # No step at all, created long ago: stale.
    record(tmp_path, pid, 8, 0, created_at=time.time() - 5 * HOUR)
    rd, skips = reader(tmp_path, stale_s=HOUR)
    assert [j.job_id for j in rd.read()] == [7]
    assert skips.reasons == ["stale"]


def test_a_live_process_is_never_stale(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    record(tmp_path, sleeper.pid, 7, 0, created_at=time.time() - 5 * HOUR)
    rd, skips = reader(tmp_path, stale_s=HOUR)
    assert [j.job_id for j in rd.read()] == [7] and skips.reasons == []


def test_missing_root_is_no_progress(tmp_path: Path) -> None:
    rd, skips = reader(tmp_path / "absent")
    assert rd.read() == [] and skips.reasons == []


# -- what is skipped, once ----------------------------------------------------------


def _garbage(root: Path, pid: int) -> Path:
    return write(root, 50, 0, os.urandom(1024))


def _bad_version(root: Path, pid: int) -> Path:
    return write(root, 50, 0, encode(pid, 50, 0, version=2))


def _non_ascii_reason(root: Path, pid: int) -> Path:
    return write(root, 50, 0, encode(pid, 50, 0, paused=True, reason="pausé".encode()))


def _negative_pid(root: Path, pid: int) -> Path:
    return write(root, 50, 0, encode(-1, 50, 0))


def _bad_step_time(root: Path, pid: int) -> Path:
    return write(root, 50, 0, encode(pid, 50, 0, step=3, step_at=float("nan")))


def _step_out_of_range(root: Path, pid: int) -> Path:
    return write(root, 50, 0, encode(pid, 50, 0, step=2**63 - 1, step_at=time.time()))


def _huge_sparse(root: Path, pid: int) -> Path:
    # A valid record at the start, 100 MB in all: the size alone disqualifies it.
    path = write(root, 50, 0, encode(pid, 50, 0))
    os.truncate(path, 100 * 1024 * 1024)
    return path


def _short(root: Path, pid: int) -> Path:
    return write(root, 50, 0, encode(pid, 50, 0)[:512])


def _symlink(root: Path, pid: int) -> Path:
    real = record(root.parent / "elsewhere", pid, 50, 0)
    path = root / "50" / "0.prog"
    path.parent.mkdir(parents=True)
    os.symlink(real, path)
    return path


def _fifo(root: Path, pid: int) -> Path:
    path = root / "50" / "0.prog"
    path.parent.mkdir(parents=True)
    os.mkfifo(path)  # opening it for reading would block
    return path


def _directory(root: Path, pid: int) -> Path:
    path = root / "50" / "0.prog"
    path.mkdir(parents=True)
    return path


def _job_mismatch(root: Path, pid: int) -> Path:
    return write(root, 50, 0, encode(pid, 51, 0))


def _rank_mismatch(root: Path, pid: int) -> Path:
    return write(root, 50, 0, encode(pid, 50, 1))


def _torn(root: Path, pid: int) -> Path:
    return write(root, 50, 0, encode(pid, 50, 0, seq=7))  # a write never finished


def _chowned(root: Path, pid: int) -> Path:
    path = record(root, pid, 50, 0)
    os.chown(path, 12345, 12345)  # not its directory's owner
    return path


def _not_the_process_owner(root: Path, pid: int) -> Path:
    # File and directory agree (uid 12345), but the live process named is root's.
    path = record(root, pid, 50, 0)
    os.chown(path.parent, 12345, 12345)
    os.chown(path, 12345, 12345)
    return path


def _non_ascii_job(root: Path, pid: int) -> Path:
    path = root / "５０" / "0.prog"  # fullwidth digits: int() takes them, we must not
    path.parent.mkdir(parents=True)
    path.write_bytes(encode(pid, 50, 0))
    return path.parent


def _non_ascii_rank(root: Path, pid: int) -> Path:
    path = root / "50" / "０.prog"
    path.parent.mkdir(parents=True)
    path.write_bytes(encode(pid, 50, 0))
    return path


def _job_file(root: Path, pid: int) -> Path:
    path = root / "50"
    path.write_bytes(encode(pid, 50, 0))
    return path


def _job_symlink(root: Path, pid: int) -> Path:
    real = record(root.parent / "elsewhere", pid, 50, 0).parent
    os.symlink(real, root / "50")
    return root / "50"


SKIPS = [
    (_garbage, "format"),
    (_bad_version, "format"),
    (_non_ascii_reason, "garbage"),
    (_negative_pid, "garbage"),
    (_bad_step_time, "garbage"),
    (_step_out_of_range, "garbage"),
    (_huge_sparse, "size"),
    (_short, "size"),
    (_symlink, "symlink"),
    (_fifo, "not_regular"),
    (_directory, "not_regular"),
    (_job_mismatch, "job_mismatch"),
    (_rank_mismatch, "rank_mismatch"),
    (_torn, "torn"),
    (_chowned, "foreign"),
    (_not_the_process_owner, "foreign"),
    (_non_ascii_job, "bad_name"),
    (_non_ascii_rank, "bad_name"),
    (_job_file, "not_directory"),
    (_job_symlink, "symlink"),
]


@pytest.mark.parametrize(("make", "reason"), SKIPS, ids=[m.__name__[1:] for m, _ in SKIPS])
def test_skipped_once_with_one_log_line(
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
    caplog: pytest.LogCaptureFixture,
    make: object,
    reason: str,
) -> None:
    root = tmp_path / "progress"
    root.mkdir()
    bad = make(root, sleeper.pid)  # type: ignore[operator]
    good = record(root, sleeper.pid, 60, 0, step=1, step_at=time.time())
    rd, skips = reader(root)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            jobs = rd.read()
            assert list(ranks(jobs)) == [(60, 0)], "only the good record is reported"
    assert skips.reasons == [reason], "counted once, not once per cycle"
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1, lines
    assert reason in lines[0] and bad.name.encode("ascii", "backslashreplace").decode() in lines[0]
    assert good.exists()


def test_skip_is_logged_again_once_the_file_came_back(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    bad = _torn(tmp_path, sleeper.pid)
    rd, skips = reader(tmp_path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        rd.read()
        bad.unlink()
        rd.read()  # gone: forgotten
        _torn(tmp_path, sleeper.pid)
        rd.read()
    assert skips.reasons == ["torn", "torn"]


def test_a_torn_read_is_retried(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer finishes its write between the reader's first and second attempt.
    path = _torn(tmp_path, sleeper.pid)
    whole = encode(sleeper.pid, 50, 0, seq=8, step=4)
    real_pread = os.pread
    calls = []

    def pread(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        calls.append(n)
        if len(calls) == 1:
            path.write_bytes(whole)
        return data

    monkeypatch.setattr(pfiles.os, "pread", pread)
    rd, skips = reader(tmp_path)
    jobs = rd.read()
    assert ranks(jobs)[(50, 0)].step == 4  # type: ignore[attr-defined]
    assert skips.reasons == []


def test_a_write_under_a_read_is_detected(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # seq was even when read, but changed before the second look: never accepted.
    path = write(tmp_path, 50, 0, encode(sleeper.pid, 50, 0, seq=2, step=1))
    real_pread = os.pread
    seq = iter(range(4, 10_000, 2))

    def pread(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        path.write_bytes(encode(sleeper.pid, 50, 0, seq=next(seq), step=2))
        return data

    monkeypatch.setattr(pfiles.os, "pread", pread)
    rd, skips = reader(tmp_path)
    assert rd.read() == [] and skips.reasons == ["torn"]


def test_newest_64_jobs_are_kept(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    now = time.time()
    for job in range(1, pr.MAX_JOBS + 3):
        path = record(tmp_path, sleeper.pid, job, 0)
        then = now - 1000 + job  # job 1 is the oldest
        os.utime(path.parent, (then, then))
    rd, skips = reader(tmp_path)
    jobs = rd.read()
    assert [j.job_id for j in jobs] == list(range(3, pr.MAX_JOBS + 3))
    assert skips.reasons == ["too_many_jobs", "too_many_jobs"]
    rd.read()
    assert len(skips.reasons) == 2


def test_newest_256_ranks_are_kept(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    now = time.time()
    for rank in range(pfiles.MAX_RANKS + 2):
        path = record(tmp_path, sleeper.pid, 9, rank)
        then = now - 1000 + (rank + 2) % (pfiles.MAX_RANKS + 2)  # ranks 256, 257 are the oldest
        os.utime(path, (then, then))
    rd, skips = reader(tmp_path)
    (job,) = rd.read()
    assert [r.rank for r in job.ranks] == list(range(pfiles.MAX_RANKS))
    assert skips.reasons == ["too_many_ranks", "too_many_ranks"]


def test_other_names_are_skipped_once(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    record(tmp_path, sleeper.pid, 9, 0)
    (tmp_path / "9" / "notes.txt").write_text("x")
    (tmp_path / "0").mkdir()  # job id 0 does not exist
    (tmp_path / "9" / "-1.prog").write_bytes(encode(sleeper.pid, 9, 0))
    rd, skips = reader(tmp_path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        rd.read()
        rd.read()
    assert sorted(skips.reasons) == ["bad_name"] * 3
    assert len([r for r in caplog.records if r.name == LOGGER]) == 3


def test_ranks_in_all_are_bounded_to_fit_the_controllers_body_limit(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    now = time.time()
    per_job = 200
    for job in (1, 2, 3):  # job 3 the newest
        for rank in range(per_job):
            record(tmp_path, sleeper.pid, job, rank)
        os.utime(tmp_path / str(job), (now - 100 + job, now - 100 + job))
    rd, skips = reader(tmp_path)
    jobs = rd.read()
    assert [(j.job_id, len(j.ranks)) for j in jobs] == [
        (1, pr.MAX_REPORTED_RANKS - 2 * per_job),
        (2, per_job),
        (3, per_job),
    ]
    assert skips.reasons == ["too_many_ranks"] * (3 * per_job - pr.MAX_REPORTED_RANKS)
    report = NodeReport(
        node="n1",
        agent_id="a",
        seq=1,
        generated_at=datetime.now(UTC),
        verdict=Verdict.HEALTHY,
        progress=jobs,
    )
    # Well under the controller's default body limit, with room for the health part.
    assert len(report.model_dump_json()) < 0.6 * ControllerConfig().max_body_bytes
