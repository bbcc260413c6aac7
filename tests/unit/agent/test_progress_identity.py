"""A progress record counts only when it comes from the job's own processes.

Real processes on this machine: a job step is a root process named ``slurmstepd`` and
titled ``slurmstepd: [<job>.0]`` (a copy of /bin/sh, as the real one is a root process
with that title), its ranks are its children, run as the job's user through setpriv as
slurmstepd runs them. Another user is uid ``OTHER``, with no account: the kernel needs
none. Job ids are far above any the local clusters on this machine hand out, whose
real slurmstepd processes the reader sees too.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from progress_records import dead_pid, encode, record, wait_until, write

from hyperpod_agent.agent.progress_reader import ProgressReader
from hyperpod_agent.health import JobProgress

pytestmark = pytest.mark.root

JOB = 3_900_000_001
OTHER_JOB = 3_900_000_002
OTHER = 54_321  # another user (the attacker)
HOUR = 3600.0


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return ""


@dataclass
class Step:
    """A fake job step: ``stepd`` (the slurmstepd) and its ranks' pids."""

    stepd: subprocess.Popen[bytes]
    ranks: list[int]

    def stop(self) -> None:
        """Kill the ranks; the slurmstepd reaps them and ends (no zombie is left to
        this machine's init, which may never reap it). A pid is killed only while it
        is still the slurmstepd's child: never a stranger that reused it."""
        if self.stepd.poll() is None:
            for pid in self.ranks:
                if parent_of(pid) == self.stepd.pid:
                    os.kill(pid, signal.SIGKILL)
        try:
            self.stepd.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.stepd.pid, signal.SIGKILL)
            self.stepd.wait(10)


def parent_of(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return int(text.rsplit(")", 1)[1].split()[1])


class Steps:
    """Starts fake job steps; stops them all at the end of the test."""

    def __init__(self, bindir: Path) -> None:
        self.exe = bindir / "slurmstepd"
        self.started: list[Step] = []

    def start(
        self,
        job: int,
        users: Sequence[int | None] = (None,),
        *,
        stepd_user: int | None = None,
        title: str | None = None,
    ) -> Step:
        """A step of ``job`` with one rank per entry of ``users`` (None: root, as the
        test runs). ``stepd_user`` runs the slurmstepd itself as another user (a
        forgery), ``title`` replaces its title."""
        lines = []
        for uid in users:
            switch = uid is not None and uid != stepd_user  # as slurmstepd does, as root
            run_as = f"setpriv --reuid={uid} --regid={uid} --clear-groups -- " if switch else ""
            lines.append(f"{run_as}sleep 120 & echo $!")
        proc = subprocess.Popen(
            [title or f"slurmstepd: [{job}.0]", "-c", "\n".join(lines) + "\nwait\n"],
            executable=self.exe,
            stdout=subprocess.PIPE,
            start_new_session=True,
            user=stepd_user,
            group=stepd_user,
        )
        assert proc.stdout is not None
        with proc.stdout:
            ranks = [int(proc.stdout.readline()) for _ in users]
        step = Step(proc, ranks)
        self.started.append(step)
        for pid in ranks:
            wait_until(lambda p=pid: comm(p) == "sleep")  # type: ignore[misc]
        return step

    def stop_all(self) -> None:
        for step in self.started:
            step.stop()


@contextmanager
def fake_steps() -> Iterator[Steps]:
    """Fake job steps, from a directory everyone may enter holding ``slurmstepd`` (a
    copy of /bin/sh); every step is stopped at the end."""
    bindir = Path(tempfile.mkdtemp(prefix="hp-fake-stepd-", dir="/tmp"))
    try:
        bindir.chmod(0o755)
        shutil.copy("/bin/sh", bindir / "slurmstepd")
        (bindir / "slurmstepd").chmod(0o755)
        made = Steps(bindir)
        try:
            yield made
        finally:
            made.stop_all()
    finally:
        shutil.rmtree(bindir, ignore_errors=True)


@pytest.fixture
def steps() -> Iterator[Steps]:
    with fake_steps() as made:
        yield made


class Skips:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


def reader(root: Path, **kw: object) -> tuple[ProgressReader, Skips]:
    skips = Skips()
    return ProgressReader(root, on_skip=skips, **kw), skips  # type: ignore[arg-type]


def owned_by(path: Path, uid: int) -> Path:
    """``path`` and its directory made ``uid``'s (as that user's own files would be)."""
    os.chown(path.parent, uid, uid)
    os.chown(path, uid, uid)
    return path


def reported(jobs: list[JobProgress]) -> dict[int, list[int]]:
    return {j.job_id: [r.rank for r in j.ranks] for j in jobs}


# -- what counts ---------------------------------------------------------------------


def test_a_rank_of_the_job_counts_and_the_report_names_its_user(
    tmp_path: Path, steps: Steps
) -> None:
    step = steps.start(JOB, users=(None, OTHER))
    record(tmp_path, step.ranks[0], JOB, 0, step=3, step_at=time.time())
    mine = steps.start(OTHER_JOB, users=(OTHER,))
    owned_by(record(tmp_path, mine.ranks[0], OTHER_JOB, 0), OTHER)
    rd, skips = reader(tmp_path)
    jobs = {j.job_id: j for j in rd.read()}
    assert reported(list(jobs.values())) == {JOB: [0], OTHER_JOB: [0]}
    assert jobs[JOB].uid == 0 and jobs[OTHER_JOB].uid == OTHER
    assert jobs[JOB].ranks[0].proc_state == "S" and skips.reasons == []


def test_a_forged_record_naming_a_dead_process_never_counts(tmp_path: Path, steps: Steps) -> None:
    # The attack: a record for a victim's job, its process "gone", so the hang looks
    # real and the node looks to blame. Nothing of this job ever ran this process.
    steps.start(JOB)
    now = time.time()
    forged = encode(
        dead_pid(),
        JOB,
        0,
        step=100,
        step_at=now - 1,
        durations=[1.0] * 20,
        hang_factor=1e-300,
        hang_min_s=1e-300,
    )
    write(tmp_path, JOB, 0, forged)
    rd, skips = reader(tmp_path)
    assert rd.read() == []
    assert skips.reasons == ["unverified"]


def test_a_record_naming_a_process_outside_the_job_does_not_count(
    tmp_path: Path, steps: Steps
) -> None:
    # The attacker's own process (same uid as the record: the old check passed), in no
    # job, or in a job of its own.
    steps.start(JOB)
    outsider = subprocess.Popen(["sleep", "120"], user=OTHER, group=OTHER)
    theirs = steps.start(OTHER_JOB, users=(OTHER,))
    try:
        wait_until(lambda: comm(outsider.pid) == "sleep")
        owned_by(record(tmp_path, outsider.pid, JOB, 0), OTHER)
        owned_by(record(tmp_path, theirs.ranks[0], JOB, 1), OTHER)
        rd, skips = reader(tmp_path)
        assert rd.read() == []
        assert skips.reasons == ["not_in_job", "not_in_job"]
    finally:
        outsider.kill()
        outsider.wait(10)


def test_a_users_own_program_named_slurmstepd_is_no_job_step(tmp_path: Path, steps: Steps) -> None:
    # Same name, same title, but not root's: its children are no job's ranks.
    steps.start(JOB)  # the job runs here
    fake = steps.start(JOB, users=(OTHER,), stepd_user=OTHER)
    owned_by(record(tmp_path, fake.ranks[0], JOB, 0), OTHER)
    rd, skips = reader(tmp_path)
    assert rd.read() == [] and skips.reasons == ["not_in_job"]


def test_a_record_of_a_job_rank_in_someone_elses_file_does_not_count(
    tmp_path: Path, steps: Steps
) -> None:
    # The attacker made the job's directory first and names a real rank of the victim.
    step = steps.start(JOB)
    owned_by(record(tmp_path, step.ranks[0], JOB, 0, step=5, step_at=time.time()), OTHER)
    rd, skips = reader(tmp_path)
    assert rd.read() == [] and skips.reasons == ["foreign"]


def test_a_rank_running_as_another_user_than_the_files_does_not_count(
    tmp_path: Path, steps: Steps
) -> None:
    step = steps.start(JOB, users=(OTHER,))
    record(tmp_path, step.ranks[0], JOB, 0)  # root's file, the rank is uid OTHER
    rd, skips = reader(tmp_path)
    assert rd.read() == [] and skips.reasons == ["foreign"]


def test_a_rank_seen_in_the_job_is_reported_gone_once_it_died(tmp_path: Path, steps: Steps) -> None:
    step = steps.start(JOB, users=(None, None))
    for rank, pid in enumerate(step.ranks):
        record(tmp_path, pid, JOB, rank, step=9, step_at=time.time())
    rd, skips = reader(tmp_path)
    assert [r.proc_state for r in rd.read()[0].ranks] == ["S", "S"]
    os.kill(step.ranks[1], signal.SIGKILL)
    wait_until(lambda: _gone_or_zombie(step.ranks[1]))
    states = [r.proc_state for r in rd.read()[0].ranks]
    assert states[0] == "S" and states[1] in ("Z", "gone"), states
    # Once the step is over and the processes are reaped, the job's records are still
    # read (the job may run elsewhere) and show the ranks gone...
    step.stop()
    assert [r.proc_state for r in rd.read()[0].ranks] == ["gone", "gone"]
    # ... but an agent that never saw them in the job (restarted, while the job still
    # runs here) cannot tell them from forgeries.
    steps.start(JOB)
    fresh, fresh_skips = reader(tmp_path)
    assert fresh.read() == [] and fresh_skips.reasons == ["unverified", "unverified"]
    assert skips.reasons == []


def _gone_or_zombie(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped between open and read
        return True
    return text.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_record_replaced_after_its_rank_died_is_not_taken_for_the_one_seen(
    tmp_path: Path, steps: Steps
) -> None:
    step = steps.start(JOB)
    path = record(tmp_path, step.ranks[0], JOB, 0, created_at=time.time() - 10)
    rd, skips = reader(tmp_path)
    assert reported(rd.read()) == {JOB: [0]}
    pid = step.ranks[0]
    step.stop()
    # Someone writes a new record under the same name for the dead pid.
    path.unlink()
    record(tmp_path, pid, JOB, 0, step=1, step_at=time.time())
    steps.start(JOB)  # the job still has a step here
    assert rd.read() == [] and skips.reasons == ["unverified"]


def test_a_time_ahead_of_the_nodes_clock_is_garbage(tmp_path: Path, steps: Steps) -> None:
    # A pause "since" tomorrow would never grow older than the controller's max_pause_s.
    step = steps.start(JOB, users=(None, None))
    tomorrow = time.time() + 86400
    record(tmp_path, step.ranks[0], JOB, 0, paused=True, pause_since=tomorrow)
    record(tmp_path, step.ranks[1], JOB, 1, step=4, step_at=time.time() + 5)  # a clock step
    rd, skips = reader(tmp_path)
    assert reported(rd.read()) == {JOB: [1]} and skips.reasons == ["garbage"]


# -- a flood of directories ----------------------------------------------------------


def test_a_flood_of_directories_costs_nothing_and_hides_nothing(
    tmp_path: Path, steps: Steps
) -> None:
    step = steps.start(JOB)
    path = record(tmp_path, step.ranks[0], JOB, 0, step=7, step_at=time.time())
    then = time.time() - 600
    os.utime(path.parent, (then, then))  # the oldest directory of all
    for job in range(100_000, 102_000):  # 2,000 newer ones, each with a forged record
        write(tmp_path, job, 0, encode(1, job, 0))  # root's files, naming init
    rd, skips = reader(tmp_path)
    assert reported(rd.read()) == {JOB: [0]}
    assert skips.reasons == []  # never even looked at


def test_the_jobs_overrides_on_a_node_are_the_largest_its_ranks_ask(
    tmp_path: Path, steps: Steps
) -> None:
    step = steps.start(JOB, users=(None, None))
    record(tmp_path, step.ranks[0], JOB, 0, hang_min_s=1e-300, hang_factor=9.0)
    record(tmp_path, step.ranks[1], JOB, 1, hang_min_s=600.0)
    (job,) = reader(tmp_path)[0].read()
    assert (job.hang_min_s, job.hang_factor) == (600.0, 9.0)
