"""Fault drills on the local cluster: run the toy training job, inject a fault, and
follow the recovery as a timeline. Shared by ``hyperpod demo``, the integration
tests and bench/recovery.py, so all three tell the same story."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient
from hyperpod_agent.slurm.models import Job

T = TypeVar("T")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_ATTEMPT = re.compile(r"^attempt (\d+) on (\S+) at ([\d.]+)")
_STEP = re.compile(r"^step=(\d+) .*at=([\d.]+)")
_RESUME = re.compile(r"^resume step=(\d+).* at=([\d.]+)")
_DONE = re.compile(r"^done step=(\d+) at=([\d.]+)")


@dataclass
class Attempt:
    nodes: str
    started_at: float
    resumed_from: int | None = None  # None: a fresh start
    resumed_at: float | None = None
    steps: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class TrainLog:
    attempts: list[Attempt]
    done_step: int | None

    @property
    def last_step(self) -> int:
        return max((s for a in self.attempts for s, _ in a.steps), default=0)


def parse_train_log(text: str) -> TrainLog:
    """The toy trainer's output (examples/train_toy.py, appended across attempts)."""
    attempts: list[Attempt] = []
    done: int | None = None
    for line in text.splitlines():
        if m := _ATTEMPT.match(line):
            attempts.append(Attempt(m.group(2), float(m.group(3))))
        elif not attempts:
            continue
        elif m := _RESUME.match(line):
            attempts[-1].resumed_from = int(m.group(1))
            attempts[-1].resumed_at = float(m.group(2))
        elif m := _STEP.match(line):
            attempts[-1].steps.append((int(m.group(1)), float(m.group(2))))
        elif m := _DONE.match(line):
            done = int(m.group(1))
    return TrainLog(attempts, done)


def submit_training(
    cluster: LocalCluster,
    steps: int = 40,
    step_time: float = 0.5,
    ckpt_every: int = 5,
    auto_resume: int | None = 1,
    extra: tuple[str, ...] = (),
) -> tuple[int, Path]:
    """sbatch examples/train.sbatch on 2 nodes; returns (job id, output file)."""
    out = cluster.dir / "out" / f"train-{time.time_ns()}.out"
    argv = ["sbatch", "--parsable", "-o", str(out), *extra]
    if auto_resume is not None:
        argv.append(f"--auto-resume={auto_resume}")
    argv += [
        str(EXAMPLES / "train.sbatch"),
        "--steps",
        str(steps),
        "--step-time",
        str(step_time),
        "--ckpt-every",
        str(ckpt_every),
    ]
    # The job's python3 must be the one that has hyperpod_agent: ours.
    env = {
        **cluster.env,
        "PATH": f"{Path(sys.executable).parent}:{cluster.env['PATH']}",
        "TRAIN_SCRIPT": str(EXAMPLES / "train_toy.py"),
    }
    res = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=30, cwd=EXAMPLES.parent
    )
    if res.returncode != 0:
        raise HyperpodError(f"sbatch failed: {res.stderr.strip()}")
    return int(res.stdout.strip().split(";")[0]), out


def healthy_gpus(cluster: LocalCluster, node: str) -> None:
    cluster.services.scenario(node).write_text(json.dumps({"generate": 8}) + "\n")


def inject_xid(cluster: LocalCluster, node: str, xid: int = 79, gpu: int = 3) -> float:
    """Edit the node's fake GPU scenario (the agent notices the change); returns
    the time of the injection."""
    scenario = {
        "generate": 8,
        "xid_events": [{"gpu": gpu, "xid": xid, "message": f"injected XID {xid}"}],
    }
    path = cluster.services.scenario(node)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(scenario) + "\n")
    at = time.time()
    tmp.replace(path)
    return at


def wait_for(what: str, timeout: float, probe: Callable[[], T], interval: float = 0.1) -> T:
    """Poll ``probe()`` until it returns something truthy; raise naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise HyperpodError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Timeline:
    fault_at: float
    drained_at: float | None = None
    requeued_at: float | None = None
    running_again_at: float | None = None
    first_new_step_at: float | None = None
    new_nodes: tuple[str, ...] = ()

    def offsets(self) -> dict[str, float | None]:
        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - self.fault_at, 2)

        return {
            "drained": rel(self.drained_at),
            "requeued": rel(self.requeued_at),
            "running_again": rel(self.running_again_at),
            "first_new_step": rel(self.first_new_step_at),
        }


def out_of_service(slurm: SlurmClient, node: str) -> bool:
    n = slurm.node(node)
    return n.drained or any(f.startswith("REBOOT") for f in n.flags) or n.state == "DOWN"


def follow_recovery(
    cluster: LocalCluster,
    job_id: int,
    victim: str,
    fault_at: float,
    out: Path,
    timeout: float = 180.0,
) -> Timeline:
    """Poll Slurm and the job's output until the job takes a new step after the fault."""
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    tl = Timeline(fault_at)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = time.time()
        if tl.drained_at is None and out_of_service(slurm, victim):
            tl.drained_at = now
        job: Job | None = slurm.job(job_id)
        if job is not None and job.restart_count >= 1:
            if tl.requeued_at is None:
                tl.requeued_at = now
            if job.state == "RUNNING" and tl.running_again_at is None:
                tl.running_again_at = now
                tl.new_nodes = job.nodes
        if tl.running_again_at is not None and out.exists():
            log = parse_train_log(out.read_text())
            later = [a for a in log.attempts[1:] if a.steps]
            if later:
                tl.first_new_step_at = later[0].steps[0][1]
                return tl
        if (
            job is not None
            and job.state in ("FAILED", "CANCELLED", "TIMEOUT", "COMPLETED")
            and job.restart_count == 0
            and now - fault_at > 30
        ):
            raise HyperpodError(f"job {job_id} ended {job.state} and was not requeued")
        time.sleep(0.1)
    raise HyperpodError(
        f"job {job_id} did not take a new step within {timeout:g} s "
        f"(timeline so far: {tl.offsets()})"
    )


def reset_cluster(cluster: LocalCluster, timeout: float = 90.0) -> None:
    """Back to the start of a drill: no jobs, healthy hardware and agents, nodes
    1..N in service and the spares drained as ``hyperpod:spare``."""
    from hyperpod_agent.localcluster.render import SPARE_REASON

    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    for job in slurm.list_jobs(all_states=False):
        slurm.cancel(job.job_id)
    services = cluster.services
    for node in cluster.shape.all_names:
        healthy_gpus(cluster, node)
        services.make_node_hardware(node)
        services.set_link(node, True)
        subprocess.run(
            ["mount", "-o", "remount,rw", str(services.scratch(node))],
            capture_output=True,
            timeout=10,
        )
        services.stop(f"agent-{node}")
        services.start_agent(node)
    wait_for(
        "reboots to finish",
        timeout,
        lambda: not any(any(f.startswith("REBOOT") for f in n.flags) for n in slurm.list_nodes()),
        interval=0.3,
    )
    for n in slurm.list_nodes():
        if n.name in cluster.spares:
            if n.reason != SPARE_REASON:
                slurm.drain(n.name, SPARE_REASON)
        elif n.drained and (n.reason.startswith("hyperpod:") or n.state == "DOWN"):
            slurm.resume(n.name)
    cluster.wait_idle(cluster.nodes, timeout=timeout)
