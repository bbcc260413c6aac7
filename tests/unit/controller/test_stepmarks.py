"""The steps a job took around a restart, kept while it runs (controller/stepmarks.py):
the highest step reached before it, in the ``resumed`` event, and the first new step's
``first_new_step`` event. They are what the goodput of an ended job is counted from."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from ctl_helpers import NOW, healthy, job, node, ts

from hyperpod_agent.controller.jobwatch import JobWatch
from hyperpod_agent.controller.snapshot import NodeHealth, Snapshot
from hyperpod_agent.controller.stepmarks import FORGET_S, MAX_JOBS, StepMarks
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import TrackedJob
from hyperpod_agent.health import JobProgress, RankProgress

JOB = 12
USER = 1001


def ranks(step: int, at: float, n: int = 2, last_s: float = 0.5) -> list[RankProgress]:
    return [
        RankProgress(rank=r, pid=100 + r, step=step, step_at=at, last_s=last_s) for r in range(n)
    ]


def snapshot(
    step: int, at: float, uid: int = USER, nodes: tuple[str, ...] = ("node1", "node2")
) -> Snapshot:
    health = {}
    for i, name in enumerate(nodes):
        jp = JobProgress(job_id=JOB, uid=uid, ranks=ranks(step, at)[i : i + 1])
        health[name] = NodeHealth(healthy().verdict, at, at, progress=(jp,))
    j = replace(
        job(JOB, nodes=("node1", "node2"), auto_resume=3), start_time=ts(NOW - 600), uid=USER
    )
    return Snapshot(
        nodes={n: node(n) for n in ("node1", "node2", "node3")}, jobs=[j], health=health
    )


def setup(store: Store, tmp_path: Path) -> tuple[JobWatch, Path]:
    store.upsert_job(TrackedJob(JOB, cap=3), [], NOW - 600)
    (tmp_path / str(JOB)).mkdir()
    return JobWatch(store), tmp_path / str(JOB) / "resume.json"


def restore(path: Path, step: int, at: float) -> None:
    path.write_text(json.dumps({"job_id": JOB, "step": step, "restart_count": 0}))
    os.utime(path, (at, at))


def test_a_restart_records_the_step_reached_and_the_first_new_step(
    store: Store, tmp_path: Path
) -> None:
    watch, path = setup(store, tmp_path)
    for step in range(10, 21):  # a step every 0.5 s, seen every second or so
        watch.read_markers(snapshot(step, NOW + step * 0.5), tmp_path, 3, NOW + step * 0.5 + 0.2)
    # The fault; the step is retried; the job restores step 19 at +15 (one step lost).
    restore(path, 19, NOW + 15)
    # Read a pass late, while the new launch already took step 20 at +16.
    watch.read_markers(snapshot(20, NOW + 16), tmp_path, 3, NOW + 16.5)
    [resumed] = store.events(kind="resumed")
    assert resumed.message == f"job {JOB} resumed from step 19 (restart 0); it had reached step 20"
    [first] = store.events(kind="first_new_step")
    assert json.loads(first.cause) == {"step": 20, "at": NOW + 16, "seen_step": 20, "step_s": 0.5}
    watch.read_markers(snapshot(21, NOW + 16.5), tmp_path, 3, NOW + 17)
    assert len(store.events(kind="first_new_step")) == 1, "once per restart"


def test_a_first_step_seen_late_is_taken_back_to_when_it_finished(
    store: Store, tmp_path: Path
) -> None:
    watch, path = setup(store, tmp_path)
    watch.read_markers(snapshot(30, NOW), tmp_path, 3, NOW + 0.2)
    restore(path, 30, NOW + 5)
    watch.read_markers(snapshot(30, NOW), tmp_path, 3, NOW + 5.5)  # the old launch's record
    assert store.events(kind="first_new_step") == []
    watch.read_markers(snapshot(34, NOW + 8), tmp_path, 3, NOW + 8.5)  # 31..34 finished
    [first] = store.events(kind="first_new_step")
    assert json.loads(first.cause)["at"] == NOW + 8 - 3 * 0.5


def test_another_users_records_are_not_the_jobs(store: Store, tmp_path: Path) -> None:
    watch, path = setup(store, tmp_path)
    watch.read_markers(snapshot(50, NOW, uid=6666), tmp_path, 3, NOW + 0.2)
    restore(path, 40, NOW + 5)
    watch.read_markers(snapshot(41, NOW + 6, uid=6666), tmp_path, 3, NOW + 6.5)
    [resumed] = store.events(kind="resumed")
    assert "reached" not in resumed.message
    assert store.events(kind="first_new_step") == []


def test_records_from_a_node_the_job_does_not_hold_are_not_its(
    store: Store, tmp_path: Path
) -> None:
    watch, path = setup(store, tmp_path)
    watch.read_markers(snapshot(50, NOW, nodes=("node3",)), tmp_path, 3, NOW + 0.2)
    restore(path, 40, NOW + 5)
    watch.read_markers(snapshot(41, NOW + 6, nodes=("node3",)), tmp_path, 3, NOW + 6.5)
    assert "reached" not in store.events(kind="resumed")[0].message
    assert store.events(kind="first_new_step") == []


def test_a_marker_dated_in_the_future_waits_from_now(store: Store, tmp_path: Path) -> None:
    """Any user can set a file's mtime: a restore "in the future" is taken as now."""
    watch, path = setup(store, tmp_path)
    watch.read_markers(snapshot(10, NOW), tmp_path, 3, NOW + 0.2)
    restore(path, 10, NOW + 10**6)
    watch.read_markers(snapshot(10, NOW), tmp_path, 3, NOW + 1)
    watch.read_markers(snapshot(11, NOW + 2), tmp_path, 3, NOW + 2.5)
    [first] = store.events(kind="first_new_step")
    assert json.loads(first.cause)["at"] == NOW + 2


def test_memory_is_bounded() -> None:
    marks = StepMarks()
    for j in range(MAX_JOBS + 50):
        marks.record([JobProgress(job_id=j + 1, ranks=ranks(1, NOW))], NOW + j * 1e-3)
    assert len(marks._jobs) == MAX_JOBS  # noqa: SLF001 - the bound is the point
    assert marks.reached_before(1, NOW + 1) is None, "the oldest seen went first"
    marks.record([], NOW + FORGET_S + 100)
    assert marks._jobs == {}  # noqa: SLF001
