"""The reconcile loop with an in-memory Slurm."""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ctl_helpers import FakeSlurm, cluster, config, job

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
from hyperpod_agent.controller.service import Controller
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.health import (
    Action,
    FaultRef,
    Finding,
    NodeReport,
    ProbeResult,
    Status,
    Verdict,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def make(
    tmp: Path,
    slurm: FakeSlurm,
    cfg: ControllerConfig | None = None,
    config_path: Path | None = None,
) -> tuple[Controller, Clock]:
    clock = Clock()
    ctl = Controller(
        # Act on a fault at once: the shared-cause wait has tests of its own.
        cfg or config(policy={"shared_cause_window_s": 0}),
        Store(tmp / "s.db"),
        slurm,
        SparePoolProvider(slurm),
        config_path=config_path,
        clock=clock,
    )
    return ctl, clock


def report(
    name: str,
    seq: int,
    at: float,
    faulty: bool,
    urgent: bool = False,
    opted: dict[int, int] | None = None,
) -> NodeReport:
    ts = datetime.fromtimestamp(at, UTC)
    findings = (
        [
            Finding(
                component="gpu0",
                code="xid79",
                status=Status.FAIL,
                action=Action.REBOOT,
                urgent=urgent,
                message="fell off the bus",
            )
        ]
        if faulty
        else []
    )
    return NodeReport(
        node=name,
        agent_id="a",
        seq=seq,
        generated_at=ts,
        verdict=Verdict.FAULTY if faulty else Verdict.HEALTHY,
        results=[
            ProbeResult(
                probe="gpu", status=Status.FAIL if faulty else Status.OK, findings=findings, at=ts
            )
        ],
        confirmed=[FaultRef(probe="gpu", component=f.component, code=f.code) for f in findings],
        jobs_opted_in=opted or {},
    )


def test_fault_report_leads_to_owned_drain_and_event(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(10))
    ctl, clock = make(tmp_path, slurm)
    ctl.ingest_report(report("node2", 1, clock.t, faulty=True))
    assert ctl.wake.is_set()
    ctl.reconcile_once()
    assert slurm.calls == [("reboot", "node2", "hyperpod:reboot gpu0 xid79 fell off the bus")]
    kinds = [e.kind for e in ctl.store.events()]
    assert kinds == ["fault", "reboot"]


def test_urgent_fault_requeues_opted_in_job(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(10), [job(7, nodes=("node2",), auto_resume=None)])
    ctl, clock = make(tmp_path, slurm)
    ctl.ingest_report(report("node2", 1, clock.t, faulty=True, urgent=True, opted={7: 2}))
    ctl.reconcile_once()
    assert ("requeue", 7) in slurm.calls
    tracked = ctl.store.job(7)
    assert tracked is not None and (tracked.cap, tracked.attempts) == (2, 1)


def test_slurm_errors_do_not_end_the_loop(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(3))
    slurm.read_fails = 1
    ctl, _ = make(tmp_path, slurm)
    before = metrics.PASSES.labels("slurm_error")._value.get()  # type: ignore[attr-defined]
    assert ctl.reconcile_once() is None
    assert metrics.PASSES.labels("slurm_error")._value.get() == before + 1  # type: ignore[attr-defined]
    assert ctl.reconcile_once() is not None


def test_run_survives_a_failing_pass_and_stops(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(3))
    ctl, _ = make(
        tmp_path, slurm, config(reconcile_interval_s=0.01, policy={"heartbeat_timeout_s": 30})
    )
    passes = []

    def boom() -> None:
        passes.append(1)
        if len(passes) == 1:
            raise RuntimeError("bug in one pass")
        if len(passes) >= 3:
            stop.set()

    ctl.reconcile_once = boom  # type: ignore[method-assign,assignment]
    stop = threading.Event()
    thread = threading.Thread(target=ctl.run, args=(stop,))
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and len(passes) >= 3


def test_config_reload_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[policy]\ndry_run = true\n")
    slurm = FakeSlurm(cluster(3))
    ctl, _ = make(tmp_path, slurm, config(), config_path=path)
    ctl._config_mtime = None
    ctl.reconcile_once()
    assert ctl.config.policy.dry_run and ctl.executor.config.policy.dry_run
    path.write_text("[policy]\ndry_run = maybe\n")
    ctl._config_mtime = None
    ctl.reconcile_once()
    assert ctl.config.policy.dry_run
    assert ctl.store.events()[-1].kind == "config_error"


def test_incident_is_announced_once_and_its_end_too(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(10))
    ctl, clock = make(tmp_path, slurm)
    for i, name in enumerate(("node2", "node3", "node4")):
        ctl.ingest_report(report(name, 1, clock.t + i, faulty=True))
    for _ in range(3):
        ctl.reconcile_once()
    assert slurm.calls == []
    assert [e.kind for e in ctl.store.events()].count("incident") == 1
    assert ctl.incident_reason and metrics.INCIDENT._value.get() == 1  # type: ignore[attr-defined]
    for i, name in enumerate(("node2", "node3", "node4")):
        ctl.ingest_report(report(name, 2, clock.t + 5 + i, faulty=False))
    clock.t += 10
    ctl.reconcile_once()
    assert ctl.store.events()[-1].kind == "incident_over" and not ctl.incident_reason


def test_healthy_again_resumes_our_node(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(10))
    ctl, clock = make(tmp_path, slurm)
    slurm.drain("node2", "hyperpod:reset gpu0 xid46 x")
    slurm.drain("node3", "maintenance")
    slurm.calls.clear()
    ctl.ingest_report(report("node2", 1, clock.t, faulty=False))
    ctl.ingest_report(report("node3", 1, clock.t, faulty=False))
    ctl.reconcile_once()
    assert slurm.calls == [("resume", "node2")]


def test_tracked_jobs_end(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(3), [job(7, auto_resume=4)])
    ctl, _ = make(tmp_path, slurm)
    ctl.reconcile_once()
    tracked = ctl.store.job(7)
    assert tracked is not None and (tracked.cap, tracked.state) == (4, "tracked")
    slurm.jobs[7] = job(7, state="COMPLETED", auto_resume=4)
    ctl.reconcile_once()
    tracked = ctl.store.job(7)
    assert tracked is not None and tracked.state == "done"


def test_heartbeats_survive_a_restart(tmp_path: Path) -> None:
    from hyperpod_agent.controller.ingest import Heartbeat, Rejected

    slurm = FakeSlurm(cluster(3))
    ctl, clock = make(tmp_path, slurm)
    ctl.ingest_heartbeat(Heartbeat("node1", "a", 4, clock.t))
    ctl.reconcile_once()
    again = Controller(
        config(), Store(tmp_path / "s.db"), slurm, SparePoolProvider(slurm), clock=clock
    )
    with pytest.raises(Rejected, match="not newer"):
        again.ingest_heartbeat(Heartbeat("node1", "a", 4, clock.t))


def test_restart_after_crash_between_intent_and_apply_drains_once(tmp_path: Path) -> None:
    class Crash(BaseException):  # a real crash is os._exit: nothing catches it
        pass

    def crash(point: str = "") -> None:
        raise Crash

    slurm = FakeSlurm(cluster(10))
    ctl, clock = make(tmp_path, slurm)
    ctl.executor._crash_hook = crash
    f = Finding(component="gpu0", code="xid46", status=Status.FAIL, action=Action.RESET)
    ts = datetime.fromtimestamp(clock.t, UTC)
    ctl.ingest_report(
        NodeReport(
            node="node4",
            agent_id="a",
            seq=1,
            generated_at=ts,
            verdict=Verdict.FAULTY,
            results=[ProbeResult(probe="gpu", status=Status.FAIL, findings=[f], at=ts)],
            confirmed=[FaultRef(probe="gpu", component="gpu0", code="xid46")],
        )
    )
    with pytest.raises(Crash):
        ctl.reconcile_once()
    assert slurm.calls == []
    restarted = Controller(
        config(), Store(tmp_path / "s.db"), slurm, SparePoolProvider(slurm), clock=clock
    )
    for _ in range(3):
        clock.t += 1
        restarted.reconcile_once()
    assert slurm.names("drain") == ["node4"]


def test_odd_but_valid_reports_never_break_a_pass(tmp_path: Path) -> None:
    big = 2**32 - 1  # the largest job id Slurm can give
    slurm = FakeSlurm(cluster(3), [job(big, auto_resume=None, nodes=("node1",))])
    ctl, clock = make(tmp_path, slurm)
    ctl.ingest_report(
        report("node1", 1, clock.t, faulty=True, urgent=True, opted={big: 100_000, 1: 5})
    )
    ctl.ingest_report(report("ghost", 1, clock.t, faulty=True))  # not in Slurm
    assert ctl.reconcile_once() is not None
    tracked = ctl.store.job(big)
    assert tracked is not None and tracked.cap == 1000


def test_a_users_resume_marker_cannot_stop_remediation(tmp_path: Path) -> None:
    # Any user can write <checkpoint_root>/<job>/resume.json; rewriting it with a step
    # no database can hold must not stop a single drain or requeue on the cluster.
    root = tmp_path / "ckpt"
    (root / "7").mkdir(parents=True)
    slurm = FakeSlurm(cluster(10), [job(7, nodes=("node1",), auto_resume=2)])
    cfg = config(policy={"shared_cause_window_s": 0}, auto_resume={"checkpoint_root": str(root)})
    ctl, clock = make(tmp_path, slurm, cfg)
    for i, step in enumerate((2**64, 2**63, 10**30)):
        marker = root / "7" / "resume.json"
        marker.write_text(f'{{"job_id": 7, "step": {step}}}')
        os.utime(marker, (clock.t + i, clock.t + i))
        ctl.ingest_report(report("node2", 1 + i, clock.t, faulty=i == 0))
        assert ctl.reconcile_once() is not None
    assert slurm.names("reboot") == ["node2"]
    assert ctl.store.job(7) is not None and ctl.store.job(7).resumed_from_step is None  # type: ignore[union-attr]


def test_a_job_slurm_shows_with_an_absurd_id_is_left_alone(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(10), [job(2**70, nodes=("node1",), auto_resume=2)])
    ctl, clock = make(tmp_path, slurm)
    ctl.ingest_report(report("node2", 1, clock.t, faulty=True))
    assert ctl.reconcile_once() is not None
    assert slurm.names("reboot") == ["node2"]


def _gpu_report(name: str, seq: int, at: float, status: Status) -> NodeReport:
    ts = datetime.fromtimestamp(at, UTC)
    xid = Finding(
        component="gpu0", code="xid79", status=Status.FAIL, action=Action.REBOOT, urgent=True
    )
    failing = status is Status.FAIL
    return NodeReport(
        node=name,
        agent_id="a",
        seq=seq,
        generated_at=ts,
        verdict=Verdict.FAULTY if failing else Verdict.DEGRADED,
        results=[ProbeResult(probe="gpu", status=status, findings=[xid] if failing else [], at=ts)],
        confirmed=[FaultRef(probe="gpu", component="gpu0", code="xid79")] if failing else [],
    )


def test_a_probe_timeout_between_two_reports_of_a_fault_is_not_a_repeat(tmp_path: Path) -> None:
    # xid79, then one gpu probe timeout (UNKNOWN), then xid79 again: one fault, one
    # remedy, never an escalation to REPLACE.
    slurm = FakeSlurm(cluster(10))
    ctl, clock = make(tmp_path, slurm)
    for seq, status in enumerate((Status.FAIL, Status.UNKNOWN, Status.FAIL), start=1):
        ctl.ingest_report(_gpu_report("node2", seq, clock.t, status))
        ctl.reconcile_once()
        clock.t += 1
    assert [f.code for f in ctl.store.open_faults()] == ["xid79"]
    assert len(ctl.store.node_faults("node2")) == 1
    assert slurm.names("reboot") == ["node2"] and slurm.names("drain") == []
    assert "fault_cleared" not in [e.kind for e in ctl.store.events()]
