"""Progress recording never raises and never writes where it should not: outside a job,
on a broken or full file system, or where another user planted something."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
from pathlib import Path

import pytest

from hyperpod_agent import progress
from hyperpod_agent.progress import format as fmt
from hyperpod_agent.shared_root import prepare_shared_root

from .conftest import JOB, RANK, rank_env, read, run_python

NOBODY = 65534
CALLS = """
    from hyperpod_agent import progress
    for n in range(3):
        progress.step(n)
    with progress.paused("evaluation"):
        progress.step(9)
    progress.resume()
    print("path:", progress.path())
"""


def every_call() -> None:
    """Every public call, as a training loop would make them."""
    for n in range(3):
        progress.step(n)
    progress.pause("evaluation")
    with progress.paused("checkpoint save"):
        progress.step(3)
    progress.resume()
    progress.resume()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "hyperpod_agent.progress" and r.levelno >= logging.WARNING
    ]


def test_outside_a_job_nothing_happens(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="hyperpod_agent.progress"):
        every_call()
        assert progress.path() is None
    assert not root.exists()
    assert warnings_of(caplog) == [], "not being in a job is normal, not a warning"


@pytest.mark.parametrize(
    "var, value",
    [
        ("SLURM_JOB_ID", "abc"),
        ("SLURM_JOB_ID", "0"),
        ("SLURM_JOB_ID", "-3"),
        ("SLURM_JOB_ID", "99999999999"),
        ("SLURM_JOB_ID", "١٢"),  # digits int() accepts
        ("SLURM_PROCID", "x"),
        ("SLURM_PROCID", "-1"),
        ("RANK", "twelve"),
    ],
)
def test_a_bad_job_id_or_rank_disables_with_one_warning(
    job: Path,
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    var: str,
    value: str,
) -> None:
    monkeypatch.setenv(var, value)
    with caplog.at_level(logging.WARNING, logger="hyperpod_agent.progress"):
        every_call()
    assert progress.path() is None and not root.exists()
    (line,) = warnings_of(caplog)
    assert f"{var}={value!r}" in line


def test_no_parent_directory_no_record(
    job: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = tmp_path / "no-shm" / "hyperpod-progress"  # like a node without /dev/shm
    monkeypatch.setenv(fmt.ROOT_ENV, str(base))
    with caplog.at_level(logging.WARNING, logger="hyperpod_agent.progress"):
        every_call()
    assert progress.path() is None and not base.parent.exists()
    (line,) = warnings_of(caplog)
    assert str(base) in line


def test_a_root_that_is_a_file(job: Path, root: Path, caplog: pytest.LogCaptureFixture) -> None:
    root.write_text("not a directory")
    every_call()
    assert progress.path() is None and root.read_text() == "not a directory"
    assert len(warnings_of(caplog)) == 1


def test_a_root_that_is_a_symbolic_link_is_not_followed(
    job: Path, root: Path, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    root.symlink_to(target)
    every_call()
    assert progress.path() is None and list(target.iterdir()) == []


def test_a_planted_job_directory_link_is_not_followed(
    job: Path, root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root.mkdir(mode=0o1777)
    target = tmp_path / "elsewhere"
    target.mkdir()
    job.parent.symlink_to(target)
    every_call()
    assert progress.path() is None and list(target.iterdir()) == []
    assert len(warnings_of(caplog)) == 1


def test_a_planted_record_link_is_not_followed(
    job: Path, root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job.parent.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    job.symlink_to(victim)
    every_call()
    assert progress.path() is None
    assert victim.read_bytes() == b"precious" and job.is_symlink()
    (line,) = warnings_of(caplog)
    assert str(job) in line and "not a regular file" in line
    assert sorted(os.listdir(job.parent)) == [job.name], "no temporary file left"


def test_a_record_path_that_is_a_directory(job: Path, caplog: pytest.LogCaptureFixture) -> None:
    job.mkdir(parents=True)
    every_call()
    assert progress.path() is None and job.is_dir()
    assert len(warnings_of(caplog)) == 1


def test_a_job_directory_others_may_write_is_refused(
    job: Path, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job.parent.mkdir(parents=True)
    job.parent.chmod(0o777)
    every_call()
    assert progress.path() is None and list(job.parent.iterdir()) == []
    (line,) = warnings_of(caplog)
    assert "others may write" in line


@pytest.mark.root
def test_a_job_directory_of_another_user_is_refused(
    job: Path, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job.parent.mkdir(parents=True, mode=0o755)
    os.chown(job.parent, NOBODY, NOBODY)  # made before the job by someone else
    every_call()
    assert progress.path() is None and list(job.parent.iterdir()) == []
    (line,) = warnings_of(caplog)
    assert f"uid {NOBODY}" in line


@pytest.mark.root
def test_a_record_of_another_user_is_left_alone(
    job: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job.parent.mkdir(parents=True)
    job.write_bytes(b"theirs")
    os.chown(job, NOBODY, NOBODY)
    every_call()
    assert progress.path() is None and job.read_bytes() == b"theirs"
    assert len(warnings_of(caplog)) == 1


@pytest.mark.root
def test_a_root_this_user_cannot_write_costs_the_record_not_the_job(shared_tmp: Path) -> None:
    root = shared_tmp / "progress"
    root.mkdir(mode=0o755)  # root's, and closed to others
    out = run_python(CALLS, rank_env(root), uid=NOBODY)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["path: None"]
    (line,) = out.stderr.splitlines()
    assert "Permission denied" in line
    assert list(root.iterdir()) == []


@pytest.mark.root
def test_a_user_records_in_the_root_the_agent_prepared(shared_tmp: Path) -> None:
    root = shared_tmp / "progress"
    prepare_shared_root(root)  # as the node agent does at start
    out = run_python(CALLS, rank_env(root), uid=NOBODY)
    assert out.returncode == 0, out.stderr
    path = fmt.record_path(root, JOB, RANK)
    assert out.stdout.splitlines() == [f"path: {path}"]
    rec = read(path)
    assert rec.step == 9 and not rec.paused and rec.pid > 0
    assert (os.stat(path).st_uid, os.stat(path.parent).st_uid) == (NOBODY, NOBODY)
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o755


@pytest.mark.root
def test_a_user_records_in_the_private_directory_slurmstepd_made_for_the_job(
    shared_tmp: Path,
) -> None:
    root = shared_tmp / "progress"
    prepare_shared_root(root)
    made = root / str(JOB)  # as the SPANK plugin makes it: root's mkdir, then handed over
    made.mkdir(mode=0o700)
    os.chown(made, NOBODY, NOBODY)
    out = run_python(CALLS, rank_env(root), uid=NOBODY)
    assert out.returncode == 0, out.stderr
    path = fmt.record_path(root, JOB, RANK)
    assert out.stdout.splitlines() == [f"path: {path}"]
    assert read(path).step == 9 and os.stat(path).st_uid == NOBODY
    st = os.stat(made)  # left as it was made: private, the user's
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o700)


@pytest.mark.root
def test_a_job_directory_never_handed_to_the_user_costs_the_record_not_the_job(
    shared_tmp: Path,
) -> None:
    root = shared_tmp / "progress"
    prepare_shared_root(root)
    (root / str(JOB)).mkdir(mode=0o700)  # root's still: slurmstepd could not hand it over
    out = run_python(CALLS, rank_env(root), uid=NOBODY)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["path: None"]
    (line,) = out.stderr.splitlines()
    assert f"{root / str(JOB)}: Permission denied" in line
    assert list((root / str(JOB)).iterdir()) == []


@pytest.mark.root
def test_a_full_file_system_disables_without_a_crash(job: Path, root: Path) -> None:
    root.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4k,mode=1777", "hp-progress-test", str(root)],
        check=True,
        timeout=30,
    )
    try:
        (root / "fill").write_bytes(b"x" * 4096)
        out = run_python(CALLS, rank_env(root))
        assert out.returncode == 0, out.stderr  # a mapped page we could not get is SIGBUS
        assert out.stdout.splitlines() == ["path: None"]
        assert "No space left on device" in out.stderr
        assert not job.exists() and list(job.parent.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(root)], timeout=30, check=False)
