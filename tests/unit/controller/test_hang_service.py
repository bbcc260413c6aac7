"""Hangs through the reconcile loop: progress in reports, declared once, across a
restart of the controller, and recovered through the intent log."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ctl_helpers import FakeSlurm, cluster, config, job, ts
from test_service import Clock, make

from hyperpod_agent.controller.hangs.judge import judge
from hyperpod_agent.controller.ingest import Heartbeat
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
from hyperpod_agent.controller.service import Controller
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.health import JobProgress, NodeReport, RankProgress, Verdict

JOB = 9


def progress_report(
    name: str, seq: int, at: float, rank: int, last_step_at: float, state: str
) -> NodeReport:
    ranks = [
        RankProgress(
            rank=rank,
            pid=100 + rank,
            step=50,
            step_at=last_step_at,
            window=40,
            median_s=0.5,
            p95_s=0.6,
            last_s=0.5,
            proc_state=state,
        )
    ]
    return NodeReport(
        node=name,
        agent_id=f"a-{name}",
        seq=seq,
        generated_at=datetime.fromtimestamp(at, UTC),
        verdict=Verdict.HEALTHY,
        progress=[JobProgress(job_id=JOB, ranks=ranks)],
    )


def hung_cluster(tmp: Path, auto_resume: int | None) -> tuple[Controller, FakeSlurm, float]:
    t0 = 1_800_000_000.0
    running = replace(
        job(JOB, nodes=("node1", "node2"), auto_resume=auto_resume), start_time=ts(t0 - 300)
    )
    slurm = FakeSlurm(cluster(10), [running])
    ctl, clock = make(tmp, slurm)
    ctl.ingest_report(progress_report("node1", 1, clock.t, 0, clock.t - 1, "S"))
    ctl.ingest_report(progress_report("node2", 1, clock.t, 1, clock.t - 1, "S"))
    ctl.reconcile_once()
    assert [e.kind for e in ctl.store.events()] == []  # advancing: nothing to say
    clock.t += 10  # no step since: past max(3 x 0.6, 5) s
    ctl.ingest_report(progress_report("node1", 2, clock.t, 0, t0 - 1, "S"))
    ctl.ingest_report(progress_report("node2", 2, clock.t, 1, t0 - 1, "T"))
    return ctl, slurm, clock.t


def test_a_hang_is_declared_once_and_the_job_recovered(tmp_path: Path) -> None:
    ctl, slurm, _ = hung_cluster(tmp_path, auto_resume=2)
    ctl.reconcile_once()
    ctl.reconcile_once()
    events = ctl.store.events()
    assert [e.kind for e in events if e.kind == "hang"] == ["hang"]
    [hang] = [e for e in events if e.kind == "hang"]
    assert hang.job_id == JOB and "suspect node2 (node2: rank 1 state T)" in hang.message
    assert ("requeue", JOB) in slurm.calls
    assert slurm.names("reboot") == ["node2"]
    [finding] = ctl.store.job_findings(JOB)
    assert (finding.kind, finding.step) == ("hang", 50)


def test_a_restarted_controller_does_not_declare_the_same_hang_again(tmp_path: Path) -> None:
    ctl, slurm, now = hung_cluster(tmp_path, auto_resume=None)
    ctl.reconcile_once()
    ctl.reconcile_once()  # a hang is declared on the second judgement that agrees
    assert [e.kind for e in ctl.store.events()].count("hang") == 1
    assert slurm.calls == []  # not auto-resume: the event only
    ctl.store.close()
    again = Controller(
        config(policy={"shared_cause_window_s": 0}),
        Store(tmp_path / "s.db"),
        slurm,
        SparePoolProvider(slurm),
        clock=lambda: now + 30,
    )
    again.reconcile_once()
    again.reconcile_once()
    assert [e.kind for e in again.store.events()].count("hang") == 1
    assert slurm.calls == []


def test_cancel_unmanaged(tmp_path: Path) -> None:
    t0 = 1_800_000_000.0
    running = replace(job(JOB, nodes=("node1",), auto_resume=None), start_time=ts(t0 - 300))
    slurm = FakeSlurm(cluster(4), [running])
    ctl, clock = make(tmp_path, slurm, config(progress={"cancel_unmanaged": True}))
    ctl.ingest_report(progress_report("node1", 1, clock.t, 0, clock.t - 30, "S"))
    ctl.reconcile_once()
    ctl.reconcile_once()
    assert slurm.calls == [("cancel", JOB)]
    assert {"hang", "cancel"} <= {e.kind for e in ctl.store.events()}


# -- the memory ingest feeds (hangs/memory.py) ------------------------------------------
def stalled(tmp: Path) -> tuple[Controller, Clock, float]:
    """Job 9 on node1, its last step 1 s before the agent's second report."""
    t0 = 1_800_000_000.0
    running = replace(job(JOB, nodes=("node1",)), start_time=ts(t0 - 300))
    ctl, clock = make(tmp, FakeSlurm(cluster(4), [running]))
    last = clock.t - 1
    ctl.ingest_report(progress_report("node1", 1, clock.t - 5, 0, last - 1, "S"))
    ctl.ingest_report(progress_report("node1", 2, clock.t, 0, last, "S"))
    return ctl, clock, last


def beat(seq: int, at: float, agent: str = "a-node1") -> Heartbeat:
    return Heartbeat("node1", agent, seq, at)


def judged(ctl: Controller, now: float) -> list[int]:
    """One pass of the judgement, as the policy makes it with the controller's memory."""
    nodes = {n.name: n for n in ctl.slurm.list_nodes()}
    snap = ctl.snapshot(nodes, ctl.slurm.list_jobs(), now)
    return [h.job_id for h in judge(snap, ctl.config.progress, now, ctl.hang_memory)[0]]


def test_heartbeats_carry_a_stalled_report_forward_and_wake_the_loop(tmp_path: Path) -> None:
    ctl, clock, last = stalled(tmp_path)
    ctl.wake.clear()
    clock.t += 30
    ctl.ingest_heartbeat(beat(8, clock.t))  # past the 5 s limit: its first judgement now
    assert ctl.wake.is_set()
    until, _ = ctl.hang_memory.evidence("node1", clock.t - 30) or (0.0, 0.0)
    # Report 8 was built six 5 s cycles after report 2 (the reports show the cycle):
    # up to then. (The heartbeat less one cycle, as once, would say 5 s less.)
    assert until == clock.t
    assert judged(ctl, clock.t) == []  # judged hung once
    ctl.wake.clear()
    clock.t += 30
    ctl.ingest_heartbeat(beat(14, clock.t))  # news of a job awaiting its second judgement
    assert ctl.wake.is_set()
    assert judged(ctl, clock.t) == [JOB]


def test_at_the_progress_cadence_a_stall_is_declared_by_the_second_heartbeat_past_it(
    tmp_path: Path,
) -> None:
    # Shipped: while ranks record progress the agent heartbeats every cycle (5 s). The
    # last step 1 s before report 2, the limit 5 s: report 3, built a cycle later, is
    # past it (the heartbeat less a cycle would not be: it took a heartbeat more).
    ctl, clock, last = stalled(tmp_path)
    ctl.wake.clear()
    clock.t += 5.05
    ctl.ingest_heartbeat(beat(3, clock.t))
    assert ctl.wake.is_set()  # its first judgement, now
    assert judged(ctl, clock.t) == []
    ctl.wake.clear()
    clock.t += 5
    ctl.ingest_heartbeat(beat(4, clock.t))
    assert ctl.wake.is_set()  # its second
    assert judged(ctl, clock.t) == [JOB]
    assert clock.t - last == pytest.approx(11.05)  # the limit, two cycles, the sending


def test_a_report_of_a_suspect_job_wakes_the_loop(tmp_path: Path) -> None:
    ctl, clock, last = stalled(tmp_path)
    clock.t += 30
    ctl.ingest_heartbeat(beat(8, clock.t))
    assert judged(ctl, clock.t) == []
    ctl.wake.clear()
    clock.t += 2
    ctl.ingest_report(progress_report("node1", 9, clock.t, 0, clock.t - 1, "S"))  # it moved
    assert ctl.wake.is_set()
    assert judged(ctl, clock.t) == [] and ctl.hang_memory.suspects() == frozenset()


def test_a_restarted_controller_carries_the_stored_report_forward(tmp_path: Path) -> None:
    ctl, clock, last = stalled(tmp_path)
    ctl.store.close()
    again = Controller(
        config(policy={"shared_cause_window_s": 0}),
        Store(tmp_path / "s.db"),
        ctl.slurm,
        SparePoolProvider(ctl.slurm),
        clock=clock,
    )
    clock.t += 31
    again.ingest_heartbeat(beat(8, clock.t))  # six cycles after the stored report
    until, _ = again.hang_memory.evidence("node1", clock.t - 31) or (0.0, 0.0)
    assert until == clock.t - 31 / 6  # the cycle as the heartbeat shows it
    assert judged(again, clock.t) == []
    assert judged(again, clock.t + 10) == [JOB]


def test_a_restarted_agent_attests_nothing_until_its_report(tmp_path: Path) -> None:
    ctl, clock, last = stalled(tmp_path)
    clock.t += 30
    ctl.ingest_heartbeat(beat(1, clock.t, agent="a-node1-again"))
    assert judged(ctl, clock.t) == [] and ctl.hang_memory.suspects() == frozenset()
