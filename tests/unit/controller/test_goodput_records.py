"""What the goodput computation reads: the events the controller's own code writes (read
back as the computation reads them), the conversions from Slurm's job, the requeues and
the agents' progress, and the timeline it shares time out on."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from goodput_helpers import T0, ev, mark

from hyperpod_agent.controller.goodput.incidents import group, save_pauses, step_seconds
from hyperpod_agent.controller.goodput.model import PRODUCTIVE
from hyperpod_agent.controller.goodput.records import job_record, progress_marks
from hyperpod_agent.controller.goodput.timeline import Timeline
from hyperpod_agent.controller.hangs.judge import Hang
from hyperpod_agent.controller.jobwatch import JobWatch
from hyperpod_agent.controller.snapshot import Snapshot
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import ActionRow, TrackedJob
from hyperpod_agent.health import JobProgress, RankProgress
from hyperpod_agent.slurm.models import Job


# -- the words of our own events ----------------------------------------------------------
def test_the_resume_marker_event_as_the_controller_writes_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.upsert_job(TrackedJob(12, 3))
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "resume.json").write_text('{"job_id": 12, "restart_count": 1, "step": 1500}')
    snap = Snapshot(nodes={}, jobs=[Job(12, "j", "RUNNING", auto_resume=3)], tracked=store.jobs())
    JobWatch(store).read_markers(snap, tmp_path, 3, T0)
    events = [ev(0, "requeue", None, 12), *store.events(job_id=12)]
    [incident] = group(events)
    assert incident.resumed_step == 1500 and "restored" in incident.points
    store.close()


def test_the_hang_event_as_the_controller_writes_it() -> None:
    hang = Hang(
        7,
        0,
        step=250,
        idle_s=90.4,
        threshold_s=60,
        p95_s=2.0,
        suspects=(),
        evidence="",
        clear=False,
    )
    [incident] = group([ev(600, "hang", None, 7, hang.describe(), hang.describe())])
    assert incident.last_step == 250 and incident.points["fault"] == T0 + 600 - 90


def test_events_not_about_a_recovery_open_no_incident() -> None:
    events = [
        ev(1, "resumed", None, 7, message="job 7 resumed from step 5"),
        ev(2, "job_ended", None, 7),
    ]
    assert group(events) == []


def test_a_restart_long_after_a_recovery_is_not_part_of_it() -> None:
    events = [
        ev(0, "step_retry_planned", "n2", 7),
        ev(5, "step_retry_done", "n2", 7),
        ev(9000, "resumed", None, 7, message="job 7 resumed from step 9"),
    ]
    [incident] = group(events)
    assert "restored" not in incident.points


@pytest.mark.parametrize(
    ("kinds", "incidents"),
    [
        (["step_end", "step_retry_planned", "step_retry_drain"], 1),
        (["requeue_waiting", "requeue_waiting", "requeue"], 1),
        (["requeue", "requeue"], 2),
        (["step_retry_planned", "step_retry_done", "step_end"], 2),
        (["step_retry_planned", "step_retry_shrink", "step_retry_failed", "requeue"], 1),
    ],
)
def test_which_events_open_a_new_incident(kinds: list[str], incidents: int) -> None:
    assert len(group([ev(i, k, "n2", 7) for i, k in enumerate(kinds)])) == incidents


# -- conversions ----------------------------------------------------------------------------
def test_a_job_record_holds_the_nodes_before_each_requeue() -> None:
    started = datetime.fromtimestamp(T0, UTC)
    slurm = Job(7, "j", "running", nodes=("n3", "n4"), start_time=started)
    requeue = ActionRow(
        1, "requeue", None, 7, "", "x", {"nodes": ["n1", "n2"]}, "done", 1, 0, 0, 0, ""
    )
    drain = ActionRow(2, "drain", "n9", 7, "", "x", {"nodes": ["n9"]}, "done", 1, 0, 0, 0, "")
    record = job_record(7, slurm, [requeue, drain])
    assert record.nodes == {"n1", "n2", "n3", "n4"} and record.node_count == 2
    assert (record.state, record.started_at, record.ended_at) == ("RUNNING", T0, None)
    gone = job_record(7, None, [requeue])
    assert (gone.state, gone.nodes, gone.node_count) == (None, {"n1", "n2"}, 0)


def test_progress_marks_from_the_agents_reports() -> None:
    rank = RankProgress(
        rank=3,
        pid=9,
        step=41,
        step_at=T0,
        paused=True,
        pause_reason="checkpoint save",
        pause_since=T0 + 1,
        last_s=0.5,
        median_s=0.2,
    )
    [m] = progress_marks([(T0 + 2, [JobProgress(job_id=7, ranks=[rank])])])
    assert (m.job_id, m.rank, m.seen_at, m.step, m.step_at) == (7, 3, T0 + 2, 41, T0)
    assert (m.paused, m.pause_reason, m.pause_since, m.step_s) == (
        True,
        "checkpoint save",
        T0 + 1,
        0.5,
    )


def test_step_seconds_and_save_pauses() -> None:
    assert step_seconds([]) is None
    assert (
        step_seconds([mark(1, 1, step_s=1.0), mark(2, 2, step_s=3.0), mark(3, 3, step_s=None)])
        == 2.0
    )
    marks = [
        mark(9, 4, seen=10, paused=True, reason="checkpoint save", since=9),
        mark(9, 4, seen=11, paused=True, reason="checkpoint save", since=9),  # seen again
        mark(13, 5, seen=14, since=12),
        mark(20, 6, seen=21, paused=True, reason="checkpoint save", since=20),
        mark(20, 6, seen=22, paused=True, reason="evaluation", since=21.5),  # no end seen
    ]
    assert save_pauses(marks, T0 + 30) == [(T0 + 9, T0 + 12)]


# -- the timeline -----------------------------------------------------------------------------
def test_paint_keeps_what_was_painted_first_and_sums_to_the_whole() -> None:
    tl = Timeline(0.0, 10.0)
    assert tl.paint(2, 4, "a") == 2.0
    assert tl.paint(3, 6, "b") == 2.0  # 3..4 is a's
    assert tl.paint(-5, 1, "c") == 1.0  # clipped to the timeline
    assert tl.parts == [
        (0, 1, "c"),
        (1, 2, PRODUCTIVE),
        (2, 4, "a"),
        (4, 6, "b"),
        (6, 10.0, PRODUCTIVE),
    ]
    assert tl.totals(0, 10) == {"c": 1, PRODUCTIVE: 5, "a": 2, "b": 2}
    assert tl.totals(3, 5) == {"a": 1, "b": 1}


def test_take_labels_the_first_productive_seconds_after() -> None:
    tl = Timeline(0.0, 10.0)
    tl.paint(2, 4, "a")
    assert tl.take(1, 10, 3.0, "r") == (3.0, 6.0)  # 1..2, then 4..6
    assert tl.take(0, 10, 100.0, "r")[0] == 5.0  # all that is left
    assert tl.totals(0, 10) == {"r": 8.0, "a": 2.0}
