"""The controller as a real process against the real local Slurm, over loopback HTTP
with MUNGE authentication: reports in, Slurm really changes."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ctl_harness import ControllerProcess, finding, restore, wait_for

pytestmark = pytest.mark.slurm


def port_for(cluster: Any, offset: int) -> int:
    # The cluster's port base + 100 and up: clear of slurmctld and the slurmd ports.
    conf = Path(cluster.slurm_conf).read_text()
    base = int(
        next(
            line.split("=", 1)[1] for line in conf.splitlines() if line.startswith("SlurmctldPort")
        )
    )
    return base + 100 + offset


@pytest.fixture
def ctl(local_cluster: Any, tmp_path: Path) -> Iterator[ControllerProcess]:
    restore(local_cluster)
    proc = ControllerProcess(tmp_path, local_cluster, port_for(local_cluster, 1))
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        restore(local_cluster)


def scontrol(cluster: Any, *args: str) -> None:
    subprocess.run(
        ["scontrol", *args], env=cluster.env, check=True, timeout=30, capture_output=True
    )


def test_faulty_report_drains_with_owned_reason_and_healthy_report_resumes(
    ctl: ControllerProcess,
) -> None:
    ctl.report("node2", [finding("xid46", "RESET", message="page retirement failure")])
    wait_for(
        "node2 drained by us",
        lambda: (
            ctl.node("node2").drained
            and ctl.node("node2").reason.startswith("hyperpod:reset gpu0 xid46")
        ),
    )
    kinds = [e["kind"] for e in ctl.events("node2")]
    assert kinds[:2] == ["fault", "drain"], kinds
    ctl.report("node2", [])
    wait_for("node2 resumed", lambda: not ctl.node("node2").drained)
    assert ctl.events("node2")[-1]["kind"] == "resume"


def test_reboot_fault_reboots_the_node_through_slurm(ctl: ControllerProcess) -> None:
    pid = ctl.cluster.slurmd_pid("node2")
    ctl.report("node2", [finding("xid79", "REBOOT", urgent=True, message="fell off the bus")])
    # A reboot restarts slurmd: its new pid is the proof (BootTime jitters by a second).
    wait_for(
        "node2 rebooted and back",
        lambda: (
            ctl.cluster.slurmd_pid("node2") not in (None, pid) and not ctl.node("node2").drained
        ),
        timeout=40,
    )
    [reboot] = [e for e in ctl.events("node2") if e["kind"] == "reboot"]
    assert "hyperpod:reboot gpu0 xid79" in reboot["message"]


def test_human_maintenance_drain_is_never_touched(
    ctl: ControllerProcess, local_cluster: Any
) -> None:
    scontrol(local_cluster, "update", "nodename=node3", "state=drain", "reason=maintenance")
    ctl.report("node3", [finding("xid79", "REBOOT")])
    time.sleep(3)  # three reconcile passes
    ctl.report("node3", [])
    time.sleep(3)
    node = ctl.node("node3")
    assert node.drained and node.reason == "maintenance"
    assert [e["kind"] for e in ctl.events("node3")] == ["fault", "fault_cleared"]


def test_admin_action_replace_puts_the_spare_in_service(
    ctl: ControllerProcess, local_cluster: Any
) -> None:
    ctl.report("node5", [])  # the spare's agent vouches for it
    scontrol(local_cluster, "update", "nodename=node3", "state=fail", "reason=Action:Replace")
    wait_for("spare node5 in service", lambda: not ctl.node("node5").drained)
    node3 = ctl.node("node3")
    assert node3.drained
    assert node3.reason == "hyperpod:replace admin request Action:Replace"
    time.sleep(2)  # held: never resumed although nothing reports it faulty
    assert ctl.node("node3").drained


def test_kill_9_between_intent_and_apply_acts_exactly_once(
    local_cluster: Any, tmp_path: Path
) -> None:
    restore(local_cluster)
    ctl = ControllerProcess(tmp_path, local_cluster, port_for(local_cluster, 2))
    try:
        ctl.start({"HYPERPOD_TEST_CRASH_AFTER_INTENT": "1"})
        ctl.report("node4", [finding("xid46", "RESET")])
        assert ctl.proc is not None
        assert ctl.proc.wait(timeout=20) == 137
        assert not ctl.node("node4").drained  # the intent is committed, not applied
        ctl.start()
        wait_for("node4 drained after the restart", lambda: ctl.node("node4").drained)
        time.sleep(3)
        status, detail = ctl.request("GET", "/v1/nodes/node4", None)
        assert status == 200
        drains = [a for a in detail["actions"] if a["kind"] == "drain"]
        assert len(drains) == 1, drains
        assert drains[0]["state"] == "done" and drains[0]["attempts"] == 1
        assert [e["kind"] for e in ctl.events("node4")].count("drain") == 1
    finally:
        ctl.stop()
        restore(local_cluster)


@pytest.mark.parametrize(
    ("how", "node"),
    [("sbatch --auto-resume=2 (admin_comment)", "node2"), ("agent jobs_opted_in", "node3")],
)
def test_urgent_fault_requeues_an_opted_in_job(
    ctl: ControllerProcess, local_cluster: Any, how: str, node: str
) -> None:
    flag = ["--auto-resume=2"] if how.startswith("sbatch") else []
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--requeue",
            *flag,
            "-w",
            node,
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 120",
        ],
        env=local_cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    job_id = int(out.stdout.strip().split(";")[0])
    try:
        wait_for(
            f"job running on {node}", lambda: (ctl.slurm.job(job_id) or _none()).state == "RUNNING"
        )
        pid = local_cluster.slurmd_pid(node)
        _report_urgent(ctl, node, job_id if not flag else None)
        wait_for("job requeued", lambda: (ctl.slurm.job(job_id) or _none()).restart_count >= 1)
        kinds = [e["kind"] for e in ctl.events()]
        assert "requeue" in kinds and "reboot" in kinds
        status, detail = ctl.request("GET", f"/v1/jobs/{job_id}", None)
        assert status == 200 and detail["attempts"] == 1 and detail["cap"] == 2
        assert "urgent fault on " + node in detail["last_cause"]
        wait_for(
            f"{node} rebooted",
            lambda: local_cluster.slurmd_pid(node) not in (None, pid),
            timeout=40,
        )
    finally:
        subprocess.run(["scancel", str(job_id)], env=local_cluster.env, timeout=30, check=False)


def test_kill_9_between_requeue_and_its_record_counts_once(
    local_cluster: Any, tmp_path: Path
) -> None:
    # The controller dies right after `scontrol requeue` returned, before anything of
    # it is recorded: the restart finds it applied and records it once, event included.
    restore(local_cluster)
    ctl = ControllerProcess(tmp_path, local_cluster, port_for(local_cluster, 4))
    job_id = _submit(local_cluster, "node3", "--auto-resume=3")
    try:
        wait_for("job running", lambda: (ctl.slurm.job(job_id) or _none()).state == "RUNNING")
        ctl.start({"HYPERPOD_TEST_CRASH_AT": "applied:requeue"})
        _report_urgent(ctl, "node3", None)
        assert ctl.proc is not None
        assert ctl.proc.wait(timeout=30) == 137
        assert (ctl.slurm.job(job_id) or _none()).restart_count == 1  # Slurm did requeue
        ctl.start()
        wait_for("the requeue recorded", lambda: "requeue" in [e["kind"] for e in ctl.events()])
        time.sleep(3)  # a few more passes: nothing more may be counted
        status, detail = ctl.request("GET", f"/v1/jobs/{job_id}", None)
        assert status == 200 and detail["attempts"] == 1 and detail["cap"] == 3, detail
        assert [e["kind"] for e in ctl.events()].count("requeue") == 1
        assert (ctl.slurm.job(job_id) or _none()).restart_count == 1
    finally:
        subprocess.run(["scancel", str(job_id)], env=local_cluster.env, timeout=30, check=False)
        ctl.stop()
        restore(local_cluster)


def _submit(cluster: Any, node: str, *flags: str) -> int:
    out = subprocess.run(
        ["sbatch", "--parsable", "--requeue", *flags, "-w", node, "-o", "/dev/null"]
        + ["--wrap", "sleep 120"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(out.stdout.strip().split(";")[0])


class _Missing:
    state = ""
    restart_count = 0


def _none() -> Any:
    return _Missing()


def _report_urgent(ctl: ControllerProcess, node: str, opted_job: int | None) -> None:
    from datetime import UTC, datetime

    now = datetime.now(UTC).isoformat()
    body = {
        "node": node,
        "agent_id": "it-job",
        "seq": 1,
        "generated_at": now,
        "verdict": "faulty",
        "confirmed": [{"probe": "gpu", "component": "gpu0", "code": "xid79"}],
        "jobs_opted_in": {str(opted_job): 2} if opted_job is not None else {},
        "results": [
            {
                "probe": "gpu",
                "status": "FAIL",
                "at": now,
                "findings": [finding("xid79", "REBOOT", urgent=True)],
            }
        ],
    }
    status, answer = ctl.request("POST", "/v1/reports", body, node=node)
    assert status == 200, answer


def test_heartbeat_loss_acts_only_once_slurm_agrees(local_cluster: Any, tmp_path: Path) -> None:
    restore(local_cluster)
    ctl = ControllerProcess(
        tmp_path, local_cluster, port_for(local_cluster, 3), heartbeat_timeout_s=4
    )
    try:
        ctl.start()
        ctl.report("node4", [])  # the agent was there, then falls silent
        time.sleep(6)  # silent beyond the timeout, but slurmd still answers Slurm
        assert not ctl.node("node4").drained
        local_cluster.node_kill("node4")
        wait_for(
            "node4 drained for heartbeat loss",
            lambda: ctl.node("node4").reason.startswith("hyperpod:drain agent heartbeat_lost"),
            timeout=40,
        )
        local_cluster.node_start("node4")
        wait_for("slurmd node4 back", lambda: ctl.node("node4").responding, timeout=30)
        ctl.report("node4", [])
        wait_for("node4 resumed", lambda: not ctl.node("node4").drained, timeout=20)
    finally:
        ctl.stop()
        if local_cluster.slurmd_pid("node4") is None:
            local_cluster.node_start("node4")
        restore(local_cluster)
