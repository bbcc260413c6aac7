"""Which job a process belongs to, on a small fake /proc: Slurm's job cgroups where the
node has them (this machine's local cluster has none: proctrack/linuxproc), else the
slurmstepd the process descends from."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from progress_records import record

from hyperpod_agent.agent.progress_files import Membership, membership, read_procs
from hyperpod_agent.agent.progress_reader import ProgressReader

JOB = 77
V2 = "0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"
V1 = (
    "12:pids:/slurm/uid_{uid}/job_{job}/step_0/task_0\n"
    "4:freezer:/slurm/uid_{uid}/job_{job}/step_0\n"
    "1:name=systemd:/system.slice/slurmd.service\n"
)
NONE = "0::/system.slice/sshd.service\n"


class FakeProc:
    """A /proc tree with the files the agent reads: stat, status, cmdline, cgroup."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(
        self,
        pid: int,
        ppid: int,
        comm: str = "python",
        *,
        uid: int = 0,
        euid: int | None = None,
        state: str = "S",
        cmdline: str = "",
        cgroup: str = NONE,
    ) -> int:
        d = self.root / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} ({comm}) {state} {ppid} {pid} {pid} 0 -1 4194560\n")
        e = uid if euid is None else euid
        (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{e}\t{uid}\t{uid}\n")
        (d / "cmdline").write_text((cmdline or comm) + "\0")
        (d / "cgroup").write_text(cgroup)
        return pid

    def stepd(self, pid: int, job: int, step: str = "0", uid: int = 0) -> int:
        return self.add(pid, 1, "slurmstepd", uid=uid, cmdline=f"slurmstepd: [{job}.{step}]\0\0\0")


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    fake = FakeProc(tmp_path / "proc")
    fake.add(1, 0, "systemd")
    return fake


def member(proc: FakeProc, pid: int) -> Membership | None:
    return membership(str(proc.root), pid, read_procs(str(proc.root)))


# -- cgroups ---------------------------------------------------------------------------


def test_a_process_in_a_v2_job_cgroup_is_the_jobs(proc: FakeProc) -> None:
    pid = proc.add(500, 1, uid=1000, cgroup=V2.format(job=JOB))
    assert member(proc, pid) == Membership(JOB, None, "cgroup")


def test_a_v1_job_cgroup_also_names_the_jobs_user(proc: FakeProc) -> None:
    pid = proc.add(500, 1, uid=1000, cgroup=V1.format(uid=1000, job=JOB))
    assert member(proc, pid) == Membership(JOB, 1000, "cgroup")


def test_several_slurmd_per_host_name_their_scope(proc: FakeProc) -> None:
    cgroup = "0::/system.slice/node7_slurmstepd.scope/job_77/step_batch/user/task_0\n"
    assert member(proc, proc.add(500, 1, cgroup=cgroup)) == Membership(JOB, None, "cgroup")
    v1 = "4:freezer:/slurm_node7/uid_5/job_77/step_0\n"
    assert member(proc, proc.add(501, 1, cgroup=v1)) == Membership(JOB, 5, "cgroup")


@pytest.mark.parametrize(
    "cgroup",
    [
        # A user's own delegated subtree may hold any names: never anchored at the root.
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_77\n",
        "0::/user.slice/user-1000.slice/user@1000.service/system.slice/slurmstepd.scope/job_77/x\n",
        "4:freezer:/user/slurm/uid_1000/job_77\n",
        "0::/system.slice/slurmstepd.scope/job_77x/step_0\n",
        "0::/system.slice/slurmstepd.scope/job_/step_0\n",
        "0::/system.slice/slurmstepd.scope\n",
    ],
)
def test_a_lookalike_cgroup_is_no_job(proc: FakeProc, cgroup: str) -> None:
    assert member(proc, proc.add(500, 1, uid=1000, cgroup=cgroup)) is None


def test_two_jobs_at_once_is_no_answer(proc: FakeProc) -> None:
    cgroup = V1.format(uid=1000, job=JOB) + "5:memory:/slurm/uid_1000/job_78/step_0\n"
    assert member(proc, proc.add(500, 1, cgroup=cgroup)) is None


def test_the_cgroup_decides_over_the_parent(proc: FakeProc) -> None:
    proc.stepd(10, JOB)
    pid = proc.add(500, 10, uid=1000, cgroup=V2.format(job=78))
    assert member(proc, pid) == Membership(78, None, "cgroup")


# -- without cgroups: the slurmstepd above -----------------------------------------------


def test_a_descendant_of_the_jobs_slurmstepd_is_the_jobs(proc: FakeProc) -> None:
    proc.stepd(10, JOB)
    proc.add(11, 10, "torchrun", uid=1000)
    worker = proc.add(12, 11, uid=1000)
    assert member(proc, worker) == Membership(JOB, 1000, "slurmstepd")
    assert member(proc, 11) == Membership(JOB, 1000, "slurmstepd")
    assert member(proc, 10) is None  # the slurmstepd itself is no rank


@pytest.mark.parametrize(
    ("step", "job"), [("batch", JOB), ("extern", JOB), ("4294967292", JOB), ("0", JOB)]
)
def test_every_step_title_names_its_job(proc: FakeProc, step: str, job: int) -> None:
    proc.stepd(10, JOB, step)
    assert read_procs(str(proc.root)).stepds == {10: job}


def test_only_roots_slurmstepd_counts(proc: FakeProc) -> None:
    proc.stepd(10, JOB, uid=1000)  # anyone may name a program so
    proc.add(11, 1, "slurmstepd", uid=1000, euid=0, cmdline="slurmstepd: [77.0]")  # setuid
    proc.add(12, 1, "bash", cmdline="slurmstepd: [77.0]")  # root, but not slurmstepd
    proc.add(13, 10, uid=1000)
    assert read_procs(str(proc.root)).stepds == {}
    assert member(proc, 13) is None


def test_a_process_outside_any_step_is_no_job(proc: FakeProc) -> None:
    proc.stepd(10, JOB)
    proc.add(20, 1, "sshd")
    assert member(proc, proc.add(21, 20, uid=1000)) is None


def test_a_loop_of_parents_ends(proc: FakeProc) -> None:
    proc.add(30, 31)
    proc.add(31, 30)
    assert member(proc, 30) is None


def test_a_process_started_after_the_look_is_still_placed(proc: FakeProc) -> None:
    proc.stepd(10, JOB)
    procs = read_procs(str(proc.root))
    late = proc.add(40, 10, uid=1000)
    assert membership(str(proc.root), late, procs) == Membership(JOB, 1000, "slurmstepd")


# -- the reader on such a node ----------------------------------------------------------


def test_the_reader_checks_the_user_a_v1_cgroup_names(proc: FakeProc, tmp_path: Path) -> None:
    proc.stepd(10, JOB, "extern")
    ok = proc.add(500, 1, cgroup=V1.format(uid=0, job=JOB))
    wrong = proc.add(501, 1, cgroup=V1.format(uid=1000, job=JOB))
    root = tmp_path / "progress"
    record(root, ok, JOB, 0, step=1, step_at=time.time())
    record(root, wrong, JOB, 1, step=1, step_at=time.time())  # root's file
    skips: list[str] = []
    rd = ProgressReader(root, procfs=proc.root, on_skip=skips.append)
    (job,) = rd.read()
    assert [r.rank for r in job.ranks] == [0] and job.uid == 0
    assert skips == ["foreign"]


def test_the_reader_reads_only_the_jobs_with_a_step_here(proc: FakeProc, tmp_path: Path) -> None:
    proc.stepd(10, JOB)
    root = tmp_path / "progress"
    record(root, proc.add(11, 10), JOB, 0)
    record(root, proc.add(12, 1, cgroup=V2.format(job=78)), 78, 0)  # no step of 78 here
    (job,) = ProgressReader(root, procfs=proc.root).read()
    assert job.job_id == JOB
