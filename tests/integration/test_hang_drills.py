"""Hangs and stragglers on the local cluster: the toy training job records its progress,
the agents read it, the controller judges it (docs/controller.md, "Hangs and
stragglers"). A frozen rank (SIGSTOP) is the hang without a trace: no XID, no dead
link, the process is simply not running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.localcluster import drill, procs, reset
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.models import Job

pytestmark = pytest.mark.slurm

DETECT_S = 60.0  # bound on every wait for a declaration (measured: bench/hang.py)


@pytest.fixture
def cluster(service_cluster: LocalCluster) -> Iterator[LocalCluster]:
    reset.reset_cluster(service_cluster)
    yield service_cluster
    reset.reset_cluster(service_cluster)


def hyperpod(cluster: LocalCluster, *args: str) -> Any:
    res = subprocess.run(
        [sys.executable, "-m", "hyperpod_agent", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "HYPERPOD_LOCAL_CLUSTER_DIR": str(cluster.dir)},
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def events(cluster: LocalCluster, kind: str, job_id: int | None = None) -> list[dict[str, Any]]:
    doc = hyperpod(cluster, "events", "--limit", "500")
    return [e for e in doc if e["kind"] == kind and (job_id is None or e.get("job_id") == job_id)]


def steps_done(cluster: LocalCluster, job_id: int, out: Path, steps: int) -> Job:
    drill.wait_for(
        f"job {job_id} to reach step {steps}",
        90,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= steps,
    )
    return drill.job_of(cluster, job_id)


def sync_dir(cluster: LocalCluster) -> str:
    path = cluster.dir / "out" / f"sync-{time.time_ns()}"
    path.mkdir(parents=True)
    return str(path)


def own_checkpoints(cluster: LocalCluster) -> dict[str, str]:
    """A job without --auto-resume gets no checkpoint directory from the plugin."""
    return {"HYPERPOD_CHECKPOINT_DIR": str(cluster.dir / "checkpoints" / f"t{time.time_ns()}")}


def cancel(cluster: LocalCluster, job_id: int) -> None:
    subprocess.run(["scancel", str(job_id)], env=cluster.env, capture_output=True, timeout=30)


def test_a_frozen_rank_is_a_hang_named_and_the_job_resumes_from_its_checkpoint(
    cluster: LocalCluster,
) -> None:
    job_id, out = drill.submit_training(
        cluster, steps=60, step_time=0.3, ckpt_every=5, train_args=("--sync", sync_dir(cluster))
    )
    try:
        job = steps_done(cluster, job_id, out, 15)
        victim = sorted(job.nodes)[-1]
        frozen = drill.freeze_ranks(cluster, job_id, victim)
        [hang] = drill.wait_for(
            "the hang declared", DETECT_S, lambda: events(cluster, "hang", job_id), 0.5
        )
        assert f"suspect {victim} ({victim}: rank" in hang["message"], hang
        assert "state T" in hang["message"], hang
        last_before = drill.parse_train_log(out.read_text()).last_step
        # Recovered like a node fault: requeued, the frozen node rebooted, resumed.
        drill.wait_for(
            "the job running again",
            DETECT_S * 2,
            lambda: (
                len(drill.parse_train_log(out.read_text()).attempts) >= 2
                and drill.parse_train_log(out.read_text()).attempts[1].resumed_from is not None
            ),
            0.5,
        )
        log = drill.parse_train_log(out.read_text())
        resumed = log.attempts[1].resumed_from
        assert resumed is not None and last_before - resumed <= 5, (last_before, resumed)
        assert all(not procs.alive(pid) for pid in frozen)
        reboots = [e for e in events(cluster, "reboot") if e.get("node") == victim]
        assert reboots and f"job{job_id} hang" in reboots[-1]["message"], reboots
        done = drill.wait_job_end(cluster, job_id, timeout=180)
        assert done.state == "COMPLETED" and done.restart_count == 1, done
        assert len(events(cluster, "hang", job_id)) == 1  # declared once
    finally:
        cancel(cluster, job_id)


def test_kill_9_of_agent_and_controller_during_a_hang_still_declares_it_once(
    cluster: LocalCluster,
) -> None:
    # Not auto-resume: the hang is an event only, so the job stays hung for the check.
    job_id, out = drill.submit_training(
        cluster,
        steps=200,
        step_time=0.3,
        ckpt_every=50,
        auto_resume=None,
        env=own_checkpoints(cluster),
        train_args=("--sync", sync_dir(cluster)),
    )
    try:
        job = steps_done(cluster, job_id, out, 15)
        victim = sorted(job.nodes)[0]
        frozen = drill.freeze_ranks(cluster, job_id, victim)
        services = cluster.services
        for name in (f"agent-{victim}", "controller"):
            pid = services.pid(name)
            assert pid is not None, name
            os.kill(pid, signal.SIGKILL)
            drill.wait_for(f"{name} gone", 10, lambda p=pid: not procs.alive(p))  # type: ignore[misc]
        services.start_controller()
        services.start_agent(victim)
        drill.wait_for("the hang declared", DETECT_S, lambda: events(cluster, "hang", job_id), 0.5)
        time.sleep(6)  # a few more passes and agent cycles: still one declaration
        [hang] = events(cluster, "hang", job_id)
        assert f"suspect {victim}" in hang["message"], hang
        assert drill.job_of(cluster, job_id).state == "RUNNING"
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    finally:
        cancel(cluster, job_id)


def test_a_slow_node_is_named_a_straggler_and_a_uniform_job_is_not(cluster: LocalCluster) -> None:
    slow_id, slow_out = drill.submit_training(
        cluster,
        steps=45,
        step_time=0.5,
        ckpt_every=100,
        auto_resume=None,
        env=own_checkpoints(cluster),
        train_args=("--slow-rank", "1", "--slow-factor", "1.4"),
    )
    even_id, _ = drill.submit_training(
        cluster,
        steps=500,
        step_time=0.05,
        ckpt_every=1000,
        auto_resume=None,
        env=own_checkpoints(cluster),
    )
    try:
        [found] = drill.wait_for(
            "the straggler declared",
            DETECT_S,
            lambda: events(cluster, "straggler", slow_id),
            0.5,
        )
        records = drill.rank_records(cluster, slow_id)
        slow_node = next(n for n, rs in records.items() if any(r.rank == 1 for r in rs))
        assert found["node"] == slow_node and f"{slow_node} straggles" in found["message"]
        [slow_rank] = [r for r in records[slow_node] if r.rank == 1]
        assert slow_rank.step <= 30, slow_rank.step  # named within 30 of its steps
        shown = hyperpod(cluster, "node", "show", slow_node)
        assert any(f["kind"] == "straggler" for f in shown["findings"])
        assert slow_node in drill.job_of(cluster, slow_id).nodes
        done = drill.wait_job_end(cluster, even_id, timeout=180)
        assert done.state == "COMPLETED", done
        assert events(cluster, "straggler", even_id) == []
        assert drill.parse_train_log(slow_out.read_text()).attempts  # it trained
    finally:
        cancel(cluster, slow_id)
        cancel(cluster, even_id)


def test_a_paused_phase_and_a_job_without_progress_are_never_hung(
    cluster: LocalCluster,
) -> None:
    # 30 s paused: six times the 5 s floor, a hundred times the job's p95 step time
    # (the pure judgement is tested with 3 minutes in tests/unit/controller/test_hangs.py).
    job_id, out = drill.submit_training(
        cluster,
        steps=30,
        step_time=0.2,
        ckpt_every=100,
        auto_resume=None,
        env=own_checkpoints(cluster),
        train_args=("--sync", sync_dir(cluster), "--pause-at", "15", "--pause-for", "30"),
    )
    quiet = subprocess.run(
        ["sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wrap", "sleep 40"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert quiet.returncode == 0, quiet.stderr
    quiet_id = int(quiet.stdout.strip().split(";")[0])
    try:
        done = drill.wait_job_end(cluster, job_id, timeout=180)
        assert done.state == "COMPLETED", done
        log = drill.parse_train_log(out.read_text())
        [(s15, at15)] = [(s, t) for s, t in log.attempts[0].steps if s == 15]
        [(_, at16)] = [(s, t) for s, t in log.attempts[0].steps if s == 16]
        assert at16 - at15 >= 30  # it did pause
        assert events(cluster, "hang", job_id) == []
        assert events(cluster, "hang", quiet_id) == []
    finally:
        cancel(cluster, job_id)
        cancel(cluster, quiet_id)


def test_bad_files_among_the_progress_records_cost_nothing(cluster: LocalCluster) -> None:
    node = "node3"
    # The agent reads the directories of the jobs running on its node only.
    quiet = subprocess.run(
        ["sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", "sleep 120"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert quiet.returncode == 0, quiet.stderr
    job_id = int(quiet.stdout.strip().split(";")[0])
    drill.wait_for("the job running", 60, lambda: drill.job_of(cluster, job_id).state == "RUNNING")
    job_dir = cluster.shape.progress_root / node / str(job_id)
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "0.prog").write_bytes(b"garbage" * 10)
    with open(job_dir / "1.prog", "wb") as f:
        f.truncate(100 * 1024 * 1024)  # sparse: 100 MB that must never be read whole
    (job_dir / "2.prog").symlink_to("/etc/passwd")
    foreign = job_dir / "3.prog"
    foreign.write_bytes(b"\0" * 1024)
    os.chown(foreign, 12345, 12345)
    agent = cluster.services.pid(f"agent-{node}")
    log = cluster.dir / "log" / f"agent-{node}.log"
    try:
        drill.wait_for(
            "the agent's log lines for each bad file",
            30,
            lambda: all(f"{n}.prog" in log.read_text() for n in range(4)),
            0.5,
        )
        assert cluster.services.pid(f"agent-{node}") == agent  # never restarted
        shown = hyperpod(cluster, "node", "show", node)
        assert shown["verdict"] == "healthy" and shown["open_faults"] == 0
        reported = (shown.get("report") or {}).get("progress", [])
        assert job_id not in {p["job_id"] for p in reported}, reported
    finally:
        cancel(cluster, job_id)
        for path in job_dir.iterdir():
            path.unlink()
        job_dir.rmdir()
