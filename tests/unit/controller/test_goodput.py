"""Measured goodput on hand-built records with known answers: the controller's events as
it writes them for a step retry, a requeue, a hang; progress records; Slurm's job."""

from __future__ import annotations

import json
from typing import Any

import pytest
from goodput_helpers import T0, ev, fault, mark, requeued, resumed, running, step_retry

from hyperpod_agent.controller.goodput import JobGoodput, JobRecord, cluster_goodput, job_goodput

NOW = T0 + 1000


def seconds(g: JobGoodput) -> dict[str, float | None]:
    return {cause: lost.seconds for cause, lost in g.lost.items()}


def phases(g: JobGoodput, i: int = 0) -> dict[str, Any]:
    return {p: (lost.seconds, lost.complete) for p, lost in g.incidents[i].phases.items()}


def adds_up(g: JobGoodput) -> None:
    lost = sum(v for v in seconds(g).values() if v is not None)
    assert g.productive_s + lost + g.unaccounted_s == pytest.approx(g.wall_s)


def test_a_fault_retried_in_place() -> None:
    """Fault at 500 s, told to end +1, retry asked +3, drained +3.5, shrunk +4, spare in
    +6, the resume marker read at +10 (restored from step 100), the first new step
    (101) at +12; before the fault the job had reached step 120, at 2 s a step."""
    events = [*step_retry(500), resumed(510, 7, 100)]
    marks = [mark(499, 120), mark(512, 101, seen=515)]
    g = job_goodput(running(), events, marks, NOW)
    assert (g.wall_s, g.unaccounted_s) == (1000.0, 0.0)
    assert seconds(g) == {
        "detection": 1.0,
        "drain": 2.5,
        "shrink": 0.5,
        "spare_in": 2.0,
        "requeue": 0.0,
        "queue_wait": 0.0,
        "restart": 6.0,
        "recompute": 40.0,  # steps 101..120 again, 20 x 2 s
        "checkpoint": 0.0,
    }
    assert g.productive_s == pytest.approx(948.0) and g.ettr == pytest.approx(0.948)
    [incident] = g.incidents
    assert (incident.path, incident.node, incident.cause) == ("step_retry", "n2", "gpu3 xid79")
    assert incident.recomputed_steps == 20 and not incident.ongoing
    assert phases(g) == {
        "detection": (1.0, True),
        "drain": (2.5, True),
        "shrink": (0.5, True),
        "spare_in": (2.0, True),
        "restart": (6.0, True),
        "recompute": (40.0, True),
    }
    assert incident.points["first_new_step"] is not None
    assert incident.points["first_new_step"].timestamp() == T0 + 512
    assert g.limits == []
    adds_up(g)


def test_a_requeue_and_its_queue_wait() -> None:
    """Drained and requeued 2 s after the fault at 500; Slurm started the next run at 520;
    the marker read at 540 (from step 100); first new step at 545. Slurm keeps only the
    current run's start: the wall time counts from the first record (a step at 50)."""
    job = running(start=520, nodes=("n1", "n3"), held=("n2",))
    events = [*requeued(500), resumed(540, 7, 100, restart=1)]
    marks = [mark(50, 1), mark(499, 120), mark(545, 101, seen=546)]
    g = job_goodput(job, events, marks, NOW)
    assert g.wall_s == 950.0
    assert seconds(g) == {
        "detection": 2.0,
        "drain": 0.0,
        "shrink": 0.0,
        "spare_in": 0.0,
        "requeue": 0.0,
        "queue_wait": 18.0,
        "restart": 25.0,
        "recompute": 40.0,
        "checkpoint": 0.0,
    }
    assert g.productive_s == pytest.approx(950.0 - 2 - 18 - 25 - 40)
    [incident] = g.incidents
    assert incident.path == "requeue" and set(phases(g)) == {
        "detection",
        "drain",
        "requeue",
        "queue_wait",
        "restart",
        "recompute",
    }
    assert any("first start is not recorded" in x for x in g.limits)
    adds_up(g)


def test_two_faults_the_first_without_its_restart() -> None:
    """A step retry at 300 that left no resume marker, then a requeue at 700 whose run
    Slurm started at 760 and that restored step 300 at 770 (no first step recorded)."""
    job = running(start=760, nodes=("n1", "n3"), held=("n2",))
    events = [*step_retry(300), *requeued(700, bad="n1"), resumed(770, 7, 300, 1)]
    marks = [mark(10, 1), mark(699, 340)]
    g = job_goodput(job, events, marks, NOW)
    assert g.wall_s == 990.0 and len(g.incidents) == 2
    lost = seconds(g)
    assert lost["detection"] == 1.0 + 2.0
    assert (lost["drain"], lost["shrink"], lost["spare_in"]) == (2.5, 0.5, 2.0)
    assert (lost["queue_wait"], lost["restart"], lost["recompute"]) == (58.0, 10.0, 80.0)
    assert g.productive_s == pytest.approx(990.0 - 6 - 2 - 58 - 10 - 80)
    first, second = g.incidents
    assert (first.node, second.node) == ("n2", "n1")
    assert first.phases["restart"].seconds is None
    assert "counted as productive" in first.phases["restart"].why
    assert first.phases["recompute"].seconds is None
    assert "no resume marker" in first.phases["recompute"].why
    assert second.recomputed_steps == 40
    assert (g.lost["restart"].complete, g.lost["recompute"].complete) == (False, False)
    adds_up(g)


def test_a_job_without_a_fault_loses_only_its_checkpoint_saves() -> None:
    """Two ranks pause for two saves (seen under way, then seen out of them): the job's
    save time is the union, [148, 152.5] and [598, 603]."""
    marks = [
        mark(100, 50),
        mark(147, 74, seen=150, paused=True, reason="checkpoint save", since=148),
        mark(160, 80, seen=200, since=152),
        mark(590, 295, seen=600, paused=True, reason="checkpoint save", since=598),
        mark(700, 345, seen=700, since=603),
        mark(147, 74, rank=1, seen=151, paused=True, reason="checkpoint save", since=148.5),
        mark(160, 80, rank=1, seen=199, since=152.5),
        mark(300, 150, rank=1, seen=300, paused=True, reason="evaluation", since=299),
    ]
    g = job_goodput(running(), [], marks, NOW)
    assert g.incidents == [] and g.lost["checkpoint"].seconds == pytest.approx(9.5)
    assert g.ettr == pytest.approx(1 - 9.5 / 1000)
    assert not g.lost["checkpoint"].complete  # a save between two looks is never seen
    assert all(seconds(g)[c] == 0.0 for c in ("detection", "restart", "recompute"))
    adds_up(g)


def test_a_save_under_way_counts_until_now() -> None:
    marks = [mark(980, 490, seen=995, paused=True, reason="checkpoint save", since=990)]
    g = job_goodput(running(), [], marks, NOW)
    assert g.lost["checkpoint"].seconds == pytest.approx(10.0)


def test_a_job_without_progress_records() -> None:
    g = job_goodput(running(), [*step_retry(500), resumed(510, 7, 100)], [], NOW)
    assert g.lost["checkpoint"].seconds is None
    assert g.lost["checkpoint"].why == "no progress records of the job"
    assert g.lost["recompute"].seconds is None
    assert "highest step before the fault is not recorded" in g.lost["recompute"].why
    restart = g.incidents[0].phases["restart"]
    assert (restart.seconds, restart.complete) == (4.0, False)  # to the restore only
    assert g.productive_s == pytest.approx(1000 - 1 - 2.5 - 0.5 - 2 - 4)
    adds_up(g)


def test_a_hang_is_its_own_detection() -> None:
    """Declared at 600 after 90 s without a step past 250; requeued at 605; the next run
    at 640 restored step 240 at 650."""
    message = "job 7 hung: no rank advanced for 90 s past step 250 (limit 60.0 s); no suspect"
    events = [
        ev(600, "hang", None, 7, message, message),
        ev(605, "requeue", None, 7, f"hang: {message}"),
        resumed(650, 7, 240, 1),
    ]
    g = job_goodput(running(start=640), events, [mark(700, 265, step_s=2.0)], NOW)
    [incident] = g.incidents
    assert incident.points["fault"] is not None
    assert incident.points["fault"].timestamp() == T0 + 510
    assert incident.cause == message
    assert phases(g)["detection"] == (95.0, True)
    drain = incident.phases["drain"]
    assert drain.seconds is None and "counted in requeue" in drain.why
    assert phases(g)["queue_wait"] == (35.0, True)
    assert incident.recomputed_steps == 10 and phases(g)["recompute"] == (20.0, True)
    adds_up(g)


def test_a_requeued_job_still_waiting_is_an_ongoing_queue_wait() -> None:
    job = JobRecord(7, state="PENDING", nodes=frozenset({"n1", "n2"}), node_count=2)
    g = job_goodput(job, requeued(500), [mark(10, 1)], T0 + 600)
    [incident] = g.incidents
    assert incident.ongoing and g.wall_s == 590.0
    assert (seconds(g)["detection"], seconds(g)["queue_wait"]) == (2.0, 98.0)
    assert g.productive_s == pytest.approx(490.0)
    adds_up(g)


def test_a_recovery_under_way_counts_its_current_phase() -> None:
    events = step_retry(500)[:4]  # fault, told to end, retry planned, drained at 503.5
    g = job_goodput(running(), events, [], T0 + 510)
    [incident] = g.incidents
    assert incident.ongoing and incident.phases["shrink"].seconds == pytest.approx(6.5)
    assert incident.phases["spare_in"].why == "under way"


def test_an_earlier_requeue_whose_next_start_slurm_no_longer_shows() -> None:
    """Two requeues: only the second run's start is in Slurm; the first queue wait runs
    to the restore, and says what it holds."""
    job = running(start=820, nodes=("n1", "n3"), held=("n2",))
    events = [*requeued(300), resumed(400, 7, 100, 1), *requeued(800, bad="n3")]
    g = job_goodput(job, events, [mark(10, 1)], NOW)
    first, second = g.incidents
    assert first.points["running_again"] is None and second.points["running_again"] is not None
    wait = first.phases["queue_wait"]
    assert (wait.seconds, wait.complete) == (98.0, True)
    restart = first.phases["restart"]
    assert restart.seconds is None and "counted in queue_wait" in restart.why
    assert second.phases["queue_wait"].seconds == 18.0
    adds_up(g)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ([], 2.0),  # the fault at 500 on n2
        ([fault(450, "n1")], 2.0),  # another fault still open: the latest counts
        ([fault(499, "n9")], 2.0),  # a node the job never held
        ([ev(501, "fault_cleared", "n2", None, "gpu3 xid79")], None),  # cleared first
    ],
)
def test_which_fault_started_a_requeue(extra: list[Any], expected: float | None) -> None:
    events = [*requeued(500), *extra]
    g = job_goodput(running(start=600, nodes=("n1", "n3"), held=("n2",)), events, [], NOW)
    assert g.incidents[0].phases["detection"].seconds == expected


def test_a_drain_long_before_the_requeue_did_not_start_it() -> None:
    """A node drained for a mild fault lets its jobs run on: a requeue 10 minutes later
    (the job failed) does not start at that drain."""
    events = [
        ev(100, "drain", "n2", None, "mem row_remap"),
        ev(700, "requeue", None, 7, "job failed (exit 1) while n2 had a fault"),
    ]
    g = job_goodput(running(start=750, held=("n2",)), events, [mark(10, 1)], NOW)
    [incident] = g.incidents
    assert incident.points["drained"] is None
    assert incident.started_at.timestamp() == T0 + 700


def test_window_since_counts_only_what_falls_after() -> None:
    """The recovery at 500 and its recomputation (to 552) are placed where they happened:
    a window from 530 counts 22 s of recomputation and nothing of the rest."""
    events = [*step_retry(500), resumed(510, 7, 100)]
    marks = [mark(499, 120), mark(512, 101, seen=515)]
    g = job_goodput(running(), events, marks, NOW, since=T0 + 530)
    assert g.wall_s == 470.0 and g.start is not None and g.start.timestamp() == T0 + 530
    assert seconds(g)["recompute"] == pytest.approx(22.0)
    assert seconds(g)["detection"] == 0.0 and len(g.incidents) == 1
    adds_up(g)
    later = job_goodput(running(), events, marks, NOW, since=T0 + 900)
    assert later.incidents == [] and later.ettr == 1.0


def test_a_job_never_started_has_no_wall_time() -> None:
    g = job_goodput(JobRecord(9, state="PENDING"), [], [], NOW)
    assert (g.wall_s, g.ettr, g.start) == (0.0, None, None)
    assert g.limits == ["the job has not started as far as the records show"]


def test_a_job_slurm_forgot_counts_to_its_last_record() -> None:
    g = job_goodput(JobRecord(7, nodes=frozenset({"n2"})), step_retry(100), [], NOW)
    assert g.wall_s == 6.0 and g.productive_s == 0.0 and g.ettr == 0.0
    assert any("no longer shows the job" in x for x in g.limits)
    adds_up(g)


def test_an_ended_job_counts_to_its_end() -> None:
    g = job_goodput(running(state="COMPLETED", end=400), [], [], NOW)
    assert (g.wall_s, g.ettr) == (400.0, 1.0)


def test_the_cluster_weighs_each_job_by_its_nodes() -> None:
    events = [*step_retry(500), resumed(510, 7, 100)]
    marks = [mark(499, 120), mark(512, 101, seen=515)]
    jobs = [
        running(),  # 2 nodes, 948 s of 1000 productive
        running(8, nodes=("n5", "n6", "n7", "n8")),  # 4 nodes, no fault
        JobRecord(9, state="PENDING"),  # never ran: not counted
    ]
    c = cluster_goodput(jobs, events, marks, NOW)
    assert c.jobs_counted == 2 and [j.job_id for j in c.jobs] == [7, 8]
    assert (c.wall_node_s, c.productive_node_s) == (6000.0, pytest.approx(5896.0))
    assert c.ettr == pytest.approx(5896.0 / 6000.0)
    assert c.lost_node_s["detection"].seconds == 2.0
    assert c.lost_node_s["recompute"].seconds == 80.0
    ckpt = c.lost_node_s["checkpoint"]
    assert (ckpt.seconds, ckpt.complete) == (0.0, False)
    assert ckpt.why == "not known in full for 2 of 2 jobs"
    assert c.jobs[0] == job_goodput(jobs[0], events, marks, NOW)


def test_a_hang_the_job_got_over_by_itself_is_not_ongoing() -> None:
    """A hang declared at 600 (idle 90 s past step 250) and no action; the latest record
    shows the job stepping again at 700: from the hang's start to that step is not
    known (no action ended a detection), the rest is work."""
    message = "job 7 hung: no rank advanced for 90 s past step 250 (limit 60.0 s); no suspect"
    events = [ev(600, "hang", None, 7, message, message)]
    g = job_goodput(running(), events, [mark(700, 300)], NOW)
    [incident] = g.incidents
    assert not incident.ongoing
    assert (seconds(g)["detection"], g.unaccounted_s) == (None, 190.0)
    assert incident.phases["detection"].why == "not reached as far as the records show"
    still = job_goodput(running(), events, [mark(500, 250)], NOW)
    assert still.incidents[0].ongoing and seconds(still)["detection"] == 490.0
    adds_up(g)
    adds_up(still)


def test_a_second_resume_marker_in_one_recovery_keeps_the_first() -> None:
    events = [*step_retry(500), resumed(510, 7, 100), resumed(511, 7, 90)]
    g = job_goodput(running(), events, [mark(499, 120)], NOW)
    assert g.incidents[0].recomputed_steps == 20


def first_step(at: float, step: int, finished: float, step_s: float = 2.0) -> Any:
    """As controller/stepmarks.py words it: seen at ``at``, the step finished at
    ``finished`` (both from T0)."""
    cause = json.dumps({"step": step, "at": T0 + finished, "step_s": step_s})
    return ev(at, "first_new_step", None, 7, cause, f"job 7 took step {step}")


def test_an_ended_job_counts_its_restart_and_recompute_from_the_events_alone() -> None:
    """The job ended: no progress record is left. The resumed event says it had reached
    step 120; the first_new_step event says step 101 finished at +12 (seen at +15)."""
    done = running(state="COMPLETED", end=1000)
    events = [*step_retry(500), resumed(510, 7, 100, reached=120), first_step(515, 101, 512)]
    g = job_goodput(done, events, [], NOW)
    assert seconds(g)["restart"] == 6.0 and seconds(g)["recompute"] == 40.0
    assert g.productive_s == pytest.approx(948.0)
    assert g.incidents[0].recomputed_steps == 20
    assert g.incidents[0].points["first_new_step"].timestamp() == T0 + 512
    adds_up(g)


@pytest.mark.parametrize(
    "cause",
    ["", "not json", '{"step": 101}', '{"step": 102, "at": 1}', '{"step": 101, "at": "nan"}'],
)
def test_a_first_new_step_event_not_readable_is_not_a_point(cause: str) -> None:
    """A bad record (or one of a step other than the one after the restored) is left
    out: the restart then counts as productive, with the limit said."""
    events = [*step_retry(500), resumed(510, 7, 100), ev(515, "first_new_step", None, 7, cause)]
    g = job_goodput(running(state="COMPLETED", end=1000), events, [], NOW)
    assert g.incidents[0].points["first_new_step"] is None
    assert g.incidents[0].phases["restart"].complete is False
