"""The agent reads training ranks' progress records: real files, real processes (the
ranks of fake job steps, test_progress_identity.py), and a fake /proc where a test
needs more jobs than it is worth starting processes for."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from progress_records import encode, proc_state, record, wait_until, write
from test_progress_identity import Step, Steps, fake_steps
from test_progress_identity_cgroup import FakeProc

from hyperpod_agent.agent import progress_files as pfiles
from hyperpod_agent.agent import progress_reader as pr
from hyperpod_agent.agent.progress_reader import ProgressReader
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.health import JobProgress, NodeReport, Verdict

pytestmark = pytest.mark.root  # the fake job steps' slurmstepd is root's, as the real one

HOUR = 3600.0
LOGGER = "hyperpod_agent.agent.progress_reader"


@pytest.fixture
def steps() -> Iterator[Steps]:
    with fake_steps() as made:
        yield made


def rank_of(steps: Steps, job: int) -> int:
    """The pid of the one rank of a new step of ``job``."""
    return steps.start(job).ranks[0]


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


def test_a_record_is_summarised(tmp_path: Path, steps: Steps) -> None:
    now = time.time()
    pid = rank_of(steps, 42)
    record(
        tmp_path,
        pid,
        42,
        3,
        step=99,
        step_at=now - 1,
        created_at=now - 60,
        durations=[float(d) for d in range(1, 101)],
        hang_factor=4.0,
    )
    record(tmp_path, pid, 42, 1, step=-1, created_at=now - 5, hang_factor=4.0)
    rd, skips = reader(tmp_path)
    jobs = rd.read()
    assert [j.job_id for j in jobs] == [42]
    job = jobs[0]
    assert job.hang_factor == 4.0 and job.hang_min_s is None and job.uid == 0
    assert [r.rank for r in job.ranks] == [1, 3]  # sorted by rank
    fresh, busy = job.ranks
    assert fresh.step == -1 and fresh.step_at is None and fresh.window == 0
    assert fresh.median_s is None and fresh.last_s is None
    assert busy.pid == pid and busy.step == 99
    assert busy.step_at == pytest.approx(now - 1)
    assert (busy.window, busy.median_s, busy.p95_s, busy.last_s) == (100, 50.5, 95.0, 100.0)
    assert busy.proc_state == "S" and not busy.paused and busy.pause_since is None
    assert skips.reasons == []


def test_ring_wrap_keeps_the_newest_128(tmp_path: Path, steps: Steps) -> None:
    record(tmp_path, rank_of(steps, 7), 7, 0, step=299, step_at=time.time(), durations=range(300))
    (job,) = reader(tmp_path)[0].read()
    (rank,) = job.ranks
    # The ring holds durations 172..299.
    assert rank.window == 128 and rank.last_s == 299.0
    assert rank.median_s == 235.5 and rank.p95_s == 293.0


def test_paused_phase(tmp_path: Path, steps: Steps) -> None:
    since = time.time() - 30
    pid = rank_of(steps, 7)
    record(tmp_path, pid, 7, 0, paused=True, pause_since=since, reason=b"checkpoint")
    (job,) = reader(tmp_path)[0].read()
    (rank,) = job.ranks
    assert rank.paused and rank.pause_reason == "checkpoint"
    assert rank.pause_since == pytest.approx(since)


def test_stopped_process_shows_t(tmp_path: Path, steps: Steps) -> None:
    pid = rank_of(steps, 7)
    record(tmp_path, pid, 7, 0)
    rd = reader(tmp_path)[0]
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: proc_state(pid) == "T")
    assert rd.read()[0].ranks[0].proc_state == "T"
    os.kill(pid, signal.SIGCONT)
    wait_until(lambda: proc_state(pid) == "S")
    assert rd.read()[0].ranks[0].proc_state == "S"


def test_exited_unreaped_process_shows_z(tmp_path: Path, steps: Steps) -> None:
    step = steps.start(7)
    pid = step.ranks[0]
    record(tmp_path, pid, 7, 0)
    os.kill(step.stepd.pid, signal.SIGSTOP)  # a parent that does not reap
    try:
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: proc_state(pid) == "Z")
        assert reader(tmp_path)[0].read()[0].ranks[0].proc_state == "Z"
    finally:
        os.kill(step.stepd.pid, signal.SIGCONT)


def _killed(step: Step) -> None:
    """The step's ranks die and are reaped: their pids are gone."""
    pids = list(step.ranks)
    step.stop()
    wait_until(lambda: all(proc_state(p) == "" for p in pids))


def test_a_rank_seen_is_gone_once_dead_until_stale(tmp_path: Path, steps: Steps) -> None:
    long_ago = time.time() - 3 * HOUR
    recent, old = steps.start(7), steps.start(8)
    record(tmp_path, recent.ranks[0], 7, 0, created_at=long_ago, step=5, step_at=time.time() - 10)
    record(
        tmp_path, old.ranks[0], 8, 0, created_at=long_ago, step=5, step_at=time.time() - 2 * HOUR
    )
    rd, skips = reader(tmp_path, stale_s=HOUR)
    assert [j.job_id for j in rd.read()] == [7, 8]  # a live process is never stale
    _killed(recent)
    _killed(old)
    jobs = rd.read()
    assert [(j.job_id, j.ranks[0].proc_state) for j in jobs] == [(7, "gone")]
    assert skips.reasons == ["stale"]


def test_stale_counts_the_newest_of_created_and_step(tmp_path: Path, steps: Steps) -> None:
    stepped, idle = steps.start(7), steps.start(8)
    # Created long ago, but its last step is recent: not stale.
    record(
        tmp_path,
        stepped.ranks[0],
        7,
        0,
        created_at=time.time() - 5 * HOUR,
        step_at=time.time() - 60,
    )
    # No step at all, created long ago: stale.
    record(tmp_path, idle.ranks[0], 8, 0, created_at=time.time() - 5 * HOUR)
    rd, skips = reader(tmp_path, stale_s=HOUR)
    assert [j.job_id for j in rd.read()] == [7, 8]
    _killed(stepped)
    _killed(idle)
    assert [j.job_id for j in rd.read()] == [7]
    assert skips.reasons == ["stale"]


def test_a_live_process_is_never_stale(tmp_path: Path, steps: Steps) -> None:
    record(tmp_path, rank_of(steps, 7), 7, 0, created_at=time.time() - 5 * HOUR)
    rd, skips = reader(tmp_path, stale_s=HOUR)
    assert [j.job_id for j in rd.read()] == [7] and skips.reasons == []


def test_missing_root_is_no_progress(tmp_path: Path, steps: Steps) -> None:
    rank_of(steps, 7)
    rd, skips = reader(tmp_path / "absent")
    assert rd.read() == [] and skips.reasons == []


def test_a_job_without_a_directory_records_nothing(tmp_path: Path, steps: Steps) -> None:
    rank_of(steps, 7)
    rd, skips = reader(tmp_path)
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


def _future_step_time(root: Path, pid: int) -> Path:
    return write(root, 50, 0, encode(pid, 50, 0, step=3, step_at=time.time() + 3600))


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


def _not_the_jobs_process(root: Path, pid: int) -> Path:
    return record(root, os.getpid(), 50, 0)  # root's, alive, in no job


def _dead_process(root: Path, pid: int) -> Path:
    return record(root, 2**31 - 7, 50, 0)  # never seen alive in the job


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
    (_future_step_time, "garbage"),
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
    (_not_the_jobs_process, "not_in_job"),
    (_dead_process, "unverified"),
    (_non_ascii_rank, "bad_name"),
    (_job_file, "not_directory"),
    (_job_symlink, "symlink"),
]


@pytest.mark.parametrize(("make", "reason"), SKIPS, ids=[m.__name__[1:] for m, _ in SKIPS])
def test_skipped_once_with_one_log_line(
    tmp_path: Path,
    steps: Steps,
    caplog: pytest.LogCaptureFixture,
    make: object,
    reason: str,
) -> None:
    root = tmp_path / "progress"
    root.mkdir()
    bad = make(root, rank_of(steps, 50))  # type: ignore[operator]
    good = record(root, rank_of(steps, 60), 60, 0, step=1, step_at=time.time())
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
    tmp_path: Path, steps: Steps, caplog: pytest.LogCaptureFixture
) -> None:
    pid = rank_of(steps, 50)
    bad = _torn(tmp_path, pid)
    rd, skips = reader(tmp_path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        rd.read()
        bad.unlink()
        rd.read()  # gone: forgotten
        _torn(tmp_path, pid)
        rd.read()
    assert skips.reasons == ["torn", "torn"]


def test_a_torn_read_is_retried(
    tmp_path: Path, steps: Steps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer finishes its write between the reader's first and second attempt.
    pid = rank_of(steps, 50)
    path = _torn(tmp_path, pid)
    whole = encode(pid, 50, 0, seq=8, step=4)
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
    tmp_path: Path, steps: Steps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # seq was even when read, but changed before the second look: never accepted.
    pid = rank_of(steps, 50)
    path = write(tmp_path, 50, 0, encode(pid, 50, 0, seq=2, step=1))
    real_pread = os.pread
    seq = iter(range(4, 10_000, 2))

    def pread(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        path.write_bytes(encode(pid, 50, 0, seq=next(seq), step=2))
        return data

    monkeypatch.setattr(pfiles.os, "pread", pread)
    rd, skips = reader(tmp_path)
    assert rd.read() == [] and skips.reasons == ["torn"]


def _fake_jobs(proc: FakeProc, root: Path, jobs: range, ranks_each: int = 1) -> None:
    """On a fake /proc: a slurmstepd per job, one rank under it, and ``ranks_each``
    records of that rank."""
    proc.add(1, 0, "systemd")
    for job in jobs:
        proc.stepd(100_000 + job, job)
        pid = proc.add(200_000 + job, 100_000 + job)
        for rank in range(ranks_each):
            record(root, pid, job, rank)


def test_64_jobs_are_read_at_most(tmp_path: Path) -> None:
    proc, root = FakeProc(tmp_path / "proc"), tmp_path / "progress"
    _fake_jobs(proc, root, range(1, pr.MAX_JOBS + 3))
    rd, skips = reader(root, procfs=proc.root)
    jobs = rd.read()
    assert [j.job_id for j in jobs] == list(range(1, pr.MAX_JOBS + 1))
    assert skips.reasons == ["too_many_jobs", "too_many_jobs"]
    rd.read()
    assert len(skips.reasons) == 2


def test_newest_256_ranks_are_kept(tmp_path: Path, steps: Steps) -> None:
    now = time.time()
    pid = rank_of(steps, 9)
    for rank in range(pfiles.MAX_RANKS + 2):
        path = record(tmp_path, pid, 9, rank)
        then = now - 1000 + (rank + 2) % (pfiles.MAX_RANKS + 2)  # ranks 256, 257 are the oldest
        os.utime(path, (then, then))
    rd, skips = reader(tmp_path)
    (job,) = rd.read()
    assert [r.rank for r in job.ranks] == list(range(pfiles.MAX_RANKS))
    assert skips.reasons == ["too_many_ranks", "too_many_ranks"]


def test_other_names_are_skipped_once(
    tmp_path: Path, steps: Steps, caplog: pytest.LogCaptureFixture
) -> None:
    pid = rank_of(steps, 9)
    record(tmp_path, pid, 9, 0)
    (tmp_path / "9" / "notes.txt").write_text("x")
    (tmp_path / "9" / "-1.prog").write_bytes(encode(pid, 9, 0))
    (tmp_path / "0").mkdir()  # the root is never listed: names there cost nothing
    (tmp_path / "５０").mkdir()
    rd, skips = reader(tmp_path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        rd.read()
        rd.read()
    assert sorted(skips.reasons) == ["bad_name"] * 2
    assert len([r for r in caplog.records if r.name == LOGGER]) == 2


def test_ranks_in_all_are_bounded_to_fit_the_controllers_body_limit(tmp_path: Path) -> None:
    proc, root = FakeProc(tmp_path / "proc"), tmp_path / "progress"
    per_job = 200
    _fake_jobs(proc, root, range(1, 4), ranks_each=per_job)
    rd, skips = reader(root, procfs=proc.root)
    jobs = rd.read()
    assert [(j.job_id, len(j.ranks)) for j in jobs] == [
        (1, per_job),
        (2, per_job),
        (3, pr.MAX_REPORTED_RANKS - 2 * per_job),
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
