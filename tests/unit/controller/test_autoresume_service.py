"""Auto-resume through the loop, the executor and the API, with an in-memory Slurm."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from ctl_helpers import NOW, FakeSlurm, cluster, config, job, node
from test_service import report

from hyperpod_agent.controller.actions import Executor
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.jobwatch import FOLLOW_UP_FOR_S, FOLLOW_UP_S
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
from hyperpod_agent.controller.service import Controller
from hyperpod_agent.controller.snapshot import Decision, Kind, PlannedAction
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import TrackedJob

DRAINED = ("DRAIN",)


class Clock:
    def __init__(self) -> None:
        self.t = NOW

    def __call__(self) -> float:
        return self.t


def make(tmp: Path, slurm: FakeSlurm, cfg: ControllerConfig | None = None) -> Controller:
    return Controller(
        cfg or config(), Store(tmp / "s.db"), slurm, SparePoolProvider(slurm), clock=Clock()
    )


def spare_cluster() -> FakeSlurm:
    nodes = cluster(4)
    nodes["node5"] = node("node5", flags=DRAINED, reason="hyperpod:spare")
    return FakeSlurm(nodes, [job(12, nodes=("node1", "node2"), auto_resume=1)])


def test_urgent_fault_under_auto_resume_job_replaces_and_requeues_in_one_pass(
    tmp_path: Path,
) -> None:
    slurm = spare_cluster()
    ctl = make(tmp_path, slurm)
    ctl.ingest_report(report("node5", 1, NOW - 1, faulty=False))  # the spare is healthy
    ctl.ingest_report(report("node2", 1, NOW, faulty=True, urgent=True))
    ctl.reconcile_once()
    reason = "hyperpod:replace gpu0 xid79 fell off the bus"
    assert slurm.calls == [("drain", "node2", reason), ("resume", "node5"), ("requeue", 12)]
    events = {e.kind: e.message for e in ctl.store.events()}
    assert events["replace_started"] == (
        "replace node2 via spare_pool (spare node5 into service): urgent gpu0 xid79 under "
        "auto-resume job 12: "
        "replace with a spare"
    )
    assert events["requeue"] == "requeue job 12: urgent fault on node2 (attempt 1/3)"
    # next pass: the spare is in service, the replacement done, the faulty node held
    ctl.reconcile_once()
    assert [a.state for a in ctl.store.open_actions()] == []
    assert slurm.nodes["node2"].reason == reason and not slurm.nodes["node5"].drained
    assert slurm.calls[3:] == []


def test_waiting_for_capacity_is_said_once_then_requeued(tmp_path: Path) -> None:
    nodes = cluster(2)
    nodes["node2"] = node("node2", flags=DRAINED, reason="hyperpod:reboot gpu0 xid79 x")
    slurm = FakeSlurm(nodes, [job(12, state="NODE_FAIL", nodes=("node1", "node2"))])
    ctl = make(tmp_path, slurm)
    for _ in range(3):
        ctl.reconcile_once()
    waits = [e for e in ctl.store.events() if e.kind == "requeue_waiting"]
    assert [(e.message, e.job_id) for e in waits] == [
        ("job 12 waits for capacity: needs 2 nodes in main, 1 usable", 12)
    ]
    assert slurm.names("requeue") == []
    slurm.nodes["node3"] = node("node3")
    ctl.reconcile_once()
    assert slurm.names("requeue") == [12]


def test_a_spare_promised_twice_in_one_pass_is_used_once(tmp_path: Path) -> None:
    nodes = cluster(4)
    nodes["node5"] = node("node5", flags=DRAINED, reason="hyperpod:spare")
    slurm = FakeSlurm(nodes)
    store = Store(tmp_path / "s.db")
    ex = Executor(store, slurm, SparePoolProvider(slurm), config())
    actions = [
        PlannedAction(
            Kind.REPLACE,
            n,
            f"hyperpod:replace gpu0 xid79 {n}",
            "c",
            takes_out=True,
            params={"spare": "node5"},
        )
        for n in ("node2", "node3")
    ]
    ex.execute(Decision(actions), slurm.nodes, [], NOW)
    assert slurm.names("resume") == ["node5"]
    assert [e.kind for e in store.events()][-2:] == ["no_replacement", "drain"]


def test_not_retried_is_bookkeeping_with_an_event(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(2))
    store = Store(tmp_path / "s.db")
    store.upsert_job(TrackedJob(7, 3, 1, "x", "requeued", NOW - 60, 0, 1500, NOW - 60))
    ex = Executor(store, slurm, SparePoolProvider(slurm), config())
    pa = PlannedAction(Kind.NOT_RETRIED, None, "", "job failed (exit 1) on healthy", job_id=7)
    ex.execute(Decision([pa]), slurm.nodes, [], NOW)
    assert store.job(7) == TrackedJob(
        7, 3, 1, "job failed (exit 1) on healthy", "failed", NOW - 60, 0, 1500, NOW
    )
    [event] = store.events()
    assert (event.kind, event.job_id) == ("not_requeued", 7)
    assert event.message == "job 7: not requeued: job failed (exit 1) on healthy"
    assert slurm.calls == []


def test_failure_on_healthy_nodes_is_said_once(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(2), [job(7, state="FAILED", exit_code=1)])
    ctl = make(tmp_path, slurm)
    for _ in range(3):
        ctl.reconcile_once()
    said = [e for e in ctl.store.events() if e.kind == "not_requeued"]
    assert len(said) == 1 and "retry_on=node_fault" in said[0].message
    assert slurm.calls == []


# -- EpilogSlurmctld ------------------------------------------------------------------
def test_job_ended_for_a_tracked_job_records_and_wakes(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(2), [job(7, auto_resume=2)])
    ctl = make(tmp_path, slurm)
    ctl.reconcile_once()
    ctl.wake.clear()
    assert ctl.job_ended(7, 233, "failed", "EpilogSlurmctld (uid 0)") is True
    assert ctl.wake.is_set()
    [event] = [e for e in ctl.store.events() if e.kind == "job_ended"]
    assert (
        event.message == "job 7 ended (state FAILED, exit 233): reported by EpilogSlurmctld (uid 0)"
    )
    assert event.job_id == 7


def test_the_epilog_of_our_requeue_does_not_read_as_success(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(2), [job(7, state="NODE_FAIL", auto_resume=2)])
    ctl = make(tmp_path, slurm)
    ctl.reconcile_once()
    assert slurm.names("requeue") == [7]
    ctl.job_ended(7, 0, None, "EpilogSlurmctld (uid 0)")
    [event] = [e for e in ctl.store.events() if e.kind == "job_ended"]
    assert event.message == (
        "job 7 left its nodes for its requeue (attempt 1/2): reported by EpilogSlurmctld (uid 0)"
    )


@pytest.mark.parametrize(
    ("jobs", "tracked", "wakes"),
    [
        ([job(7, auto_resume=None)], False, False),  # known, not opted in: ignored
        ([], False, True),  # not seen yet: the loop looks at it now
    ],
)
def test_job_ended_for_other_jobs(
    tmp_path: Path, jobs: list[object], tracked: bool, wakes: bool
) -> None:
    slurm = FakeSlurm(cluster(2), jobs)  # type: ignore[arg-type]
    ctl = make(tmp_path, slurm)
    ctl.reconcile_once()
    ctl.wake.clear()
    assert ctl.job_ended(7, None, None, "x") is tracked
    assert ctl.wake.is_set() is wakes
    assert [e for e in ctl.store.events() if e.kind == "job_ended"] == []


# -- resume.json ------------------------------------------------------------------------
def marker_setup(tmp_path: Path) -> tuple[Controller, FakeSlurm, Path]:
    root = tmp_path / "ckpt"
    slurm = FakeSlurm(cluster(2), [job(12, auto_resume=1, restart_count=1)])
    ctl = make(tmp_path, slurm, config(auto_resume={"checkpoint_root": str(root)}))
    (root / "12").mkdir(parents=True)
    return ctl, slurm, root / "12" / "resume.json"


def write(path: Path, text: str, mtime: float) -> None:
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def test_resume_marker_is_read_when_it_changes(tmp_path: Path) -> None:
    ctl, _, path = marker_setup(tmp_path)
    ctl.reconcile_once()  # tracks the job; no marker yet
    write(path, '{"job_id": 12, "restart_count": 1, "step": 1500, "at": "x"}', 1000)
    ctl.reconcile_once()
    tracked = ctl.store.job(12)
    assert tracked is not None and tracked.resumed_from_step == 1500
    [event] = [e for e in ctl.store.events() if e.kind == "resumed"]
    assert event.message == "job 12 resumed from step 1500 (restart 1)"
    ctl.reconcile_once()  # same mtime: not read again, no second event
    write(path, '{"job_id": 12, "restart_count": 2, "step": 3000}', 2000)
    ctl.reconcile_once()
    tracked = ctl.store.job(12)
    assert tracked is not None and tracked.resumed_from_step == 3000
    assert len([e for e in ctl.store.events() if e.kind == "resumed"]) == 2


def test_bad_resume_marker_is_logged_once_and_never_breaks_a_pass(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ctl, _, path = marker_setup(tmp_path)
    ctl.reconcile_once()
    write(path, "{not json", 1000)
    for _ in range(3):
        assert ctl.reconcile_once() is not None
    assert len([r for r in caplog.records if "ignoring" in r.getMessage()]) == 1
    tracked = ctl.store.job(12)
    assert tracked is not None and tracked.resumed_from_step is None


def test_resume_marker_only_for_running_jobs(tmp_path: Path) -> None:
    ctl, slurm, path = marker_setup(tmp_path)
    slurm.jobs[12] = replace(slurm.jobs[12], state="PENDING")
    write(path, '{"step": 5}', 1000)
    ctl.reconcile_once()
    ctl.reconcile_once()
    tracked = ctl.store.job(12)
    assert tracked is not None and tracked.resumed_from_step is None


def test_job_end_notice_is_followed_until_slurm_shows_the_end(tmp_path: Path) -> None:
    nodes = cluster(4)
    slurm = FakeSlurm(nodes, [job(7, nodes=("node2",), auto_resume=1)])
    ctl = make(tmp_path, slurm, config(reconcile_interval_s=10))
    ctl.reconcile_once()
    assert ctl.next_wait() == 10
    # EpilogSlurmctld runs while the job still shows COMPLETING
    slurm.jobs[7] = replace(slurm.jobs[7], state="COMPLETING")
    ctl.job_ended(7, 233, None, "epilog")
    ctl.reconcile_once()
    assert ctl.next_wait() == FOLLOW_UP_S and slurm.names("requeue") == []
    slurm.jobs[7] = replace(slurm.jobs[7], state="NODE_FAIL")
    ctl.reconcile_once()
    assert slurm.names("requeue") == [7]
    assert ctl.next_wait() == 10


def test_job_end_follow_up_gives_up_after_a_while(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(2), [job(7, state="COMPLETING", auto_resume=1)])
    ctl = make(tmp_path, slurm, config(reconcile_interval_s=10))
    ctl.reconcile_once()
    ctl.job_ended(7, None, None, "epilog")
    ctl.reconcile_once()
    assert ctl.watch.following() == {7}
    assert isinstance(ctl.clock, Clock)
    ctl.clock.t += FOLLOW_UP_FOR_S + 1
    ctl.reconcile_once()
    assert ctl.watch.following() == set() and ctl.next_wait() == 10
