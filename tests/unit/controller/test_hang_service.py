"""Hangs through the reconcile loop: progress in reports, declared once, across a
restart of the controller, and recovered through the intent log."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from ctl_helpers import FakeSlurm, cluster, config, job, ts
from test_service import make

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
