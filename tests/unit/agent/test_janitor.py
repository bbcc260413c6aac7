"""The agent frees the checkpoint memory tier of finished jobs, and only of those."""

from __future__ import annotations

import fcntl
import os
import re
import stat
import time
from pathlib import Path

import pytest

from hyperpod_agent.agent import janitor as jan
from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.agent.janitor import MemoryTierConfig, MemoryTierJanitor
from hyperpod_agent.errors import SlurmError

HOUR = 3600.0


def job_dir(root: Path, name: str, age_s: float, step_age_s: float | None = None) -> Path:
    d = root / name
    (d / "step-0000000010").mkdir(parents=True)
    (d / "step-0000000010" / "rank-00000.bin").write_bytes(b"x" * 10)
    then = time.time() - age_s
    step_then = time.time() - (age_s if step_age_s is None else step_age_s)
    os.utime(d / "step-0000000010", (step_then, step_then))
    os.utime(d, (then, then))
    return d


def make(root: Path, states: dict[int, str], **cfg: object) -> tuple[MemoryTierJanitor, list[int]]:
    asked: list[int] = []

    def lookup(job: int) -> str:
        asked.append(job)
        state = states.get(job, "finished")  # slurmctld forgot it
        if state == "error":
            raise SlurmError(["scontrol", "show", "job"], 1, "slurmctld not responding")
        return state

    config = MemoryTierConfig(root=root, **cfg)  # type: ignore[arg-type]
    return MemoryTierJanitor(config, lookup), asked


def test_only_idle_directories_of_finished_jobs_go(tmp_path: Path) -> None:
    done = job_dir(tmp_path, "101", 2 * HOUR)
    active = job_dir(tmp_path, "102", 2 * HOUR)  # e.g. requeued, pending again
    recent = job_dir(tmp_path, "103", 10)
    saving = job_dir(tmp_path, "104", 2 * HOUR, step_age_s=30)  # a save just touched it
    other = job_dir(tmp_path, "not-a-job", 2 * HOUR)
    (tmp_path / "105").write_text("a file, not a job directory")
    os.symlink(done, tmp_path / "106")
    janitor, asked = make(tmp_path, {101: "finished", 102: "active"})
    assert janitor.sweep() == [101]
    assert not done.exists()
    assert active.exists() and recent.exists() and saving.exists() and other.exists()
    assert sorted(asked) == [101, 102], "fresh directories cost no Slurm call"


def test_slurm_unreachable_keeps_everything(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = job_dir(tmp_path, "201", 3 * HOUR)
    b = job_dir(tmp_path, "202", 2 * HOUR)
    janitor, asked = make(tmp_path, {201: "error", 202: "finished"})
    assert janitor.sweep() == []
    assert a.exists() and b.exists()
    assert asked == [201], "the sweep stops at the first failure (oldest first)"
    assert "slurmctld not responding; keeping everything" in caplog.text


def test_a_bug_in_the_lookup_never_reaches_the_agent(tmp_path: Path) -> None:
    d = job_dir(tmp_path, "301", 2 * HOUR)

    def broken(job: int) -> str:
        raise RuntimeError("parser bug")

    janitor = MemoryTierJanitor(MemoryTierConfig(root=tmp_path), broken)
    assert janitor.maybe_sweep() == []
    assert d.exists()


def test_sweeps_are_spaced_and_can_be_turned_off(tmp_path: Path) -> None:
    job_dir(tmp_path, "401", 2 * HOUR)
    janitor, asked = make(tmp_path, {401: "active"}, sweep_every_s=600)
    janitor.maybe_sweep()
    janitor.maybe_sweep()
    assert asked == [401]
    off, asked_off = make(tmp_path, {}, cleanup=False)
    assert off.maybe_sweep() == [] and asked_off == []


def test_bounded_work_per_sweep(tmp_path: Path) -> None:
    for i in range(jan.MAX_CHECKS_PER_SWEEP + 5):
        job_dir(tmp_path, str(500 + i), 2 * HOUR + i)
    janitor, asked = make(tmp_path, {})
    assert len(janitor.sweep()) == jan.MAX_CHECKS_PER_SWEEP
    assert len(asked) == jan.MAX_CHECKS_PER_SWEEP
    assert len(janitor.sweep()) == 5


def test_missing_root_is_nothing_to_do(tmp_path: Path) -> None:
    janitor, asked = make(tmp_path / "absent", {})
    assert janitor.sweep() == [] and asked == []


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"idle_s": 5}, r"memory_tier\.idle_s: Input should be greater than or equal to 60"),
        ({"rootdir": "/x"}, r"memory_tier\.rootdir: Extra inputs are not permitted"),
    ],
)
def test_bad_config_names_the_key(table: dict[str, object], message: str) -> None:
    from pydantic import ValidationError

    from hyperpod_agent.config_files import format_validation_error

    with pytest.raises(ValidationError) as info:
        AgentConfig.model_validate({"memory_tier": table})
    assert re.search(message, format_validation_error("agent.toml", info.value))


def test_background_sweep_never_holds_up_the_caller(tmp_path: Path) -> None:
    import threading

    d = job_dir(tmp_path, "601", 2 * HOUR)
    release = threading.Event()

    def slow(job: int) -> str:
        release.wait(10)  # slurmctld taking its time
        return "finished"

    janitor = MemoryTierJanitor(MemoryTierConfig(root=tmp_path), slow)
    t0 = time.monotonic()
    thread = janitor.start_if_due()
    assert thread is not None and time.monotonic() - t0 < 1.0
    assert janitor.start_if_due() is None, "one sweep at a time"
    release.set()
    thread.join(10)
    assert not d.exists()


def test_odd_digit_names_never_break_a_sweep(tmp_path: Path) -> None:
    # isdigit() is true for all of these; int() refuses some, and none is a Slurm job id.
    odd = [job_dir(tmp_path, name, 2 * HOUR) for name in ("\u00b2", "\u0661\u0662", "\uff17")]
    done = job_dir(tmp_path, "801", 2 * HOUR)
    janitor, asked = make(tmp_path, {801: "finished"})
    assert janitor.sweep() == [801]
    assert not done.exists() and all(d.exists() for d in odd)
    assert asked == [801]


def run_dir(job: Path, name: str, age_s: float) -> Path:
    """A run's directory with one step, untouched for ``age_s``."""
    d = job / f"run-{name * 32}"
    step = d / "step-0000000004"
    step.mkdir(parents=True)
    (step / "rank-00000.bin").write_bytes(b"x")
    then = time.time() - age_s
    for p in (step, d):
        os.utime(p, (then, then))
    return d


def test_stale_runs_of_a_running_job_go_and_live_ones_stay(tmp_path: Path) -> None:
    job = tmp_path / "901"
    job.mkdir()
    old = run_dir(job, "a", 2 * HOUR)  # a pre-train before this fine-tune, nobody holds it
    held = run_dir(job, "b", 2 * HOUR)  # idle between two saves, its process alive
    fresh = run_dir(job, "c", 60)
    legacy = job / "step-0000000002"  # the layout before runs had directories
    legacy.mkdir()
    then = time.time() - 2 * HOUR
    os.utime(legacy, (then, then))
    lock = os.open(held / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        pending, _ = make(tmp_path, {901: "active"})
        assert pending.sweep() == [] and old.exists() and legacy.exists()
        running, asked = make(tmp_path, {901: "running"})
        assert running.sweep() == [], "the job's own directory stays"
        assert asked == [901]
        assert not old.exists() and not legacy.exists()
        assert held.exists() and fresh.exists()
    finally:
        os.close(lock)


def test_a_live_checkpointer_keeps_its_run_and_a_closed_one_frees_it(tmp_path: Path) -> None:
    import numpy as np

    from hyperpod_agent.checkpoint import Checkpointer

    ckpt = Checkpointer(tmp_path / "p", memory_dir=tmp_path / "root" / "902")
    ckpt.save(1, {"w": np.ones(4)}).wait()
    tier = ckpt.memory_dir
    assert tier is not None

    def an_hour_passes() -> None:
        then = time.time() - 2 * HOUR
        for p in (tier, *tier.iterdir()):
            os.utime(p, (then, then), follow_symlinks=False)

    an_hour_passes()
    janitor, _ = make(tmp_path / "root", {902: "running"})
    try:
        janitor.sweep()
        assert tier.exists(), "its process is alive"
    finally:
        ckpt.close()
    an_hour_passes()
    janitor.sweep()
    assert not tier.exists() and (tmp_path / "root" / "902").exists()


def test_a_fresh_step_inside_a_run_keeps_the_job_directory(tmp_path: Path) -> None:
    job = tmp_path / "903"
    job.mkdir()
    run = run_dir(job, "d", 30)  # a save just rewrote step 4's files
    then = time.time() - 2 * HOUR
    for p in (run, job):
        os.utime(p, (then, then))
    janitor, asked = make(tmp_path, {903: "finished"})
    assert janitor.sweep() == [] and job.exists() and asked == []


@pytest.mark.root
def test_the_root_is_prepared_root_owned_and_sticky(tmp_path: Path) -> None:
    root = tmp_path / "shm" / "hyperpod-ckpt"
    janitor, _ = make(root, {})
    janitor.prepare_root()
    st = os.stat(root)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o1777)
