"""Fault drills on the local cluster: run a training job (examples/train_ddp.py, a
PyTorch DDP run, or the toy), inject a fault, and follow the recovery as a timeline.
Shared by ``hyperpod demo``, the integration tests and bench/recovery.py, so all
three tell the same story. Between drills,
reset.py brings the cluster back to its start."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.progress import format as progress_format
from hyperpod_agent.progress.format import Record
from hyperpod_agent.slurm.client import SlurmClient
from hyperpod_agent.slurm.hostlist import expand_hostlist
from hyperpod_agent.slurm.models import Job

T = TypeVar("T")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_ATTEMPT = re.compile(r"^attempt (\d+) on (\S+) at ([\d.]+)")
_STEP = re.compile(r"^step=(\d+) .*at=([\d.]+)")
_RESUME = re.compile(r"^resume step=(\d+).* at=([\d.]+)")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
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
    env: dict[str, str] | None = None,
    train_args: tuple[str, ...] = (),
    script: str = "train.sbatch",
) -> tuple[int, Path]:
    """sbatch examples/``script`` (train.sbatch: the job requeued as a whole;
    train_in_place.sbatch: the step retried inside the job) on 2 nodes; returns (job
    id, output file). ``extra`` goes to sbatch, ``train_args`` to train_toy.py."""
    out = cluster.dir / "out" / f"train-{time.time_ns()}.out"
    argv = ["sbatch", "--parsable", "-o", str(out), *extra]
    if auto_resume is not None:
        argv.append(f"--auto-resume={auto_resume}")
    argv += [
        str(EXAMPLES / script),
        "--steps",
        str(steps),
        "--step-time",
        str(step_time),
        "--ckpt-every",
        str(ckpt_every),
        *train_args,
    ]
    # The job's python3 must be the one that has hyperpod_agent: ours.
    env = {
        **cluster.env,
        "PATH": f"{Path(sys.executable).parent}:{cluster.env['PATH']}",
        "TRAIN_SCRIPT": str(EXAMPLES / "train_toy.py"),
        # where the step-retry helper inside the job finds the controller
        "HYPERPOD_LOCAL_CLUSTER_DIR": str(cluster.dir),
        **(env or {}),
    }
    res = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=30, cwd=EXAMPLES.parent
    )
    if res.returncode != 0:
        raise HyperpodError(f"sbatch failed: {res.stderr.strip()}")
    return int(res.stdout.strip().split(";")[0]), out


def ddp_env(
    scratch: Path,
    port: int,
    args: str = "",
    checkpoint_dir: Path | None = None,
    peer_port: int | None = None,
) -> dict[str, str]:
    """The environment ``submit_training`` passes to examples/train_ddp.sbatch for a
    run whose files go under ``scratch``: ``port`` its rendezvous, ``peer_port``
    (default ``port + 1``) and on its nodes' replica servers. The local cluster's
    nodes share 127.0.0.1 and /dev/shm, so every node's replica server gets a port of
    its own (the base plus the node's index in the step) and its memory tier a
    directory of its own: a spare that takes a rank starts without it and restores
    from its peer's replica, as on real machines.
    ``checkpoint_dir`` None: the SPANK plugin's ``<checkpoint_root>/<jobid>``."""
    env = {
        "TRAIN_SCRIPT": str(EXAMPLES / "train_ddp.py"),
        "TRAIN_DDP_ARGS": f"--peer-host 127.0.0.1 --memory-per-node {scratch / 'shm'} "
        f"--out {scratch / 'out'} {args}".strip(),
        "TRAIN_DDP_PEER_PORT": str(port + 1 if peer_port is None else peer_port),
        "MASTER_PORT": str(port),
        # The nodes' names resolve to no local interface here: gloo says so on every
        # start, then takes the loopback anyway.
        "GLOO_SOCKET_IFNAME": "lo",
    }
    if checkpoint_dir is not None:
        env["HYPERPOD_CHECKPOINT_DIR"] = str(checkpoint_dir)
    return env


def job_of(cluster: LocalCluster, job_id: int) -> Job:
    """The job as slurmctld shows it now; an error once slurmctld has forgotten it."""
    job = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10).job(job_id)
    if job is None:
        raise HyperpodError(f"job {job_id} vanished")
    return job


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


@dataclass
class Recovery:
    """One injected fault being followed until its job takes a new step."""

    job_id: int
    victim: str
    out: Path
    timeline: Timeline

    def update(self, slurm: SlurmClient, now: float) -> bool:
        """Record what changed since the last look; True once the story is complete."""
        tl = self.timeline
        if tl.drained_at is None and out_of_service(slurm, self.victim):
            tl.drained_at = now
        job = slurm.job(self.job_id)
        if job is not None and job.restart_count >= 1:
            if tl.requeued_at is None:
                tl.requeued_at = now
            if job.state == "RUNNING" and tl.running_again_at is None:
                tl.running_again_at = now
                tl.new_nodes = job.nodes
        if tl.running_again_at is not None and self.out.exists():
            later = [a for a in parse_train_log(self.out.read_text()).attempts[1:] if a.steps]
            if later:
                tl.first_new_step_at = later[0].steps[0][1]
                return True
        if job is not None and job.state in ENDED and job.restart_count == 0:
            if now - tl.fault_at > 30:
                raise HyperpodError(f"job {self.job_id} ended {job.state} and was not requeued")
        return False


def follow_all(
    cluster: LocalCluster, recoveries: list[Recovery], timeout: float = 180.0
) -> list[Timeline]:
    """Poll Slurm and the jobs' output until every job took a new step after its fault."""
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    pending = list(recoveries)
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            r = pending[0]
            raise HyperpodError(
                f"job {r.job_id} did not take a new step within {timeout:g} s "
                f"(timeline so far: {r.timeline.offsets()})"
            )
        now = time.time()
        pending = [r for r in pending if not r.update(slurm, now)]
        time.sleep(0.1)
    return [r.timeline for r in recoveries]


def follow_recovery(
    cluster: LocalCluster,
    job_id: int,
    victim: str,
    fault_at: float,
    out: Path,
    timeout: float = 180.0,
) -> Timeline:
    """Follow one injected fault (see ``follow_all``)."""
    return follow_all(cluster, [Recovery(job_id, victim, out, Timeline(fault_at))], timeout)[0]


def follow_step_retry(
    cluster: LocalCluster,
    job_id: int,
    victim: str,
    fault_at: float,
    out: Path,
    timeout: float = 300.0,
) -> Timeline:
    """Follow a fault on a step under ``srun --auto-resume`` (train_in_place.sbatch): the
    node out, the step running again (its rank 0's first line), its first new step.
    The job is never requeued: ``requeued`` stays empty."""
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    tl = Timeline(fault_at)
    deadline = time.monotonic() + timeout
    while tl.first_new_step_at is None:
        if time.monotonic() > deadline:
            raise HyperpodError(
                f"job {job_id}: no new step within {timeout:g} s (timeline: {tl.offsets()})"
            )
        if tl.drained_at is None and out_of_service(slurm, victim):
            tl.drained_at = time.time()
        job = slurm.job(job_id)  # before the log: a job that ended wrote all of it
        attempts = parse_train_log(out.read_text()).attempts if out.exists() else []
        if len(attempts) >= 2:
            tl.running_again_at = attempts[1].started_at
            tl.new_nodes = tuple(expand_hostlist(attempts[1].nodes))
            if attempts[1].steps:
                tl.first_new_step_at = attempts[1].steps[0][1]
                break
        if job is not None and (job.restart_count > 0 or job.state in ENDED):
            raise HyperpodError(f"job {job_id} left its allocation: {job.state}, {tl.offsets()}")
        time.sleep(0.1)
    return tl


def wait_job_end(cluster: LocalCluster, job_id: int, timeout: float = 180.0) -> Job:
    """The job once it has ended for good (Slurm's requeues are followed through)."""
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)

    def ended() -> Job | None:
        job = slurm.job(job_id)
        if job is None:
            raise HyperpodError(f"job {job_id} is no longer known to Slurm")
        return job if job.state in ENDED else None

    job = wait_for(f"job {job_id} to end", timeout, ended, interval=0.5)
    assert job is not None  # wait_for returns only a truthy value
    return job


def rank_records(cluster: LocalCluster, job_id: int) -> dict[str, list[Record]]:
    """node -> the job's progress records on it (the TaskProlog puts each node's under
    its own directory), read whole; records being written are skipped."""
    out: dict[str, list[Record]] = {}
    for name in cluster.shape.all_names:
        job_dir = cluster.shape.progress_root / name / str(job_id)
        for path in sorted(job_dir.glob(f"*{progress_format.SUFFIX}")):
            try:
                out.setdefault(name, []).append(progress_format.decode(path.read_bytes()))
            except (OSError, progress_format.FormatError):
                continue
    return out


def freeze_ranks(cluster: LocalCluster, job_id: int, node: str) -> list[int]:
    """SIGSTOP the job's ranks on ``node`` (a rank that stops making progress without a
    trace); returns their pids."""
    pids = [r.pid for r in rank_records(cluster, job_id).get(node, []) if r.pid > 0]
    if not pids:
        raise HyperpodError(f"job {job_id} has no progress records on {node}")
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def spares_qualified(cluster: LocalCluster) -> bool:
    """No deep-check run under way, and every pooled spare passed one since it last
    entered the pool (its ``hyperpod:spare`` reason's time)."""
    from datetime import datetime

    from hyperpod_agent.admin.common import make_client
    from hyperpod_agent.localcluster.render import SPARE_REASON

    client = make_client(None, None, cluster.dir / "etc" / "admin.toml", 10)
    runs = client.checks()
    if not isinstance(runs, list) or any(r.get("phase") != "done" for r in runs):
        return False
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    for name in cluster.spares:
        node = slurm.node(name)
        if node.reason.strip() != SPARE_REASON:
            continue  # standing in for a node, or out: not in the pool
        # reason_time has whole seconds
        since = node.reason_time.timestamp() - 1.0 if node.reason_time else 0.0
        outcomes = client.node(name).get("deep_checks", [])
        if not any(
            o.get("outcome") == "OK"
            and o.get("at")
            and datetime.fromisoformat(o["at"]).timestamp() >= since
            for o in outcomes
        ):
            return False
    return True


def wait_spares_ready(cluster: LocalCluster, timeout: float = 180.0) -> float:
    """Wait until ``spares_qualified``; the seconds it took. With a deep-check suite named
    the spare gate is on, as shipped: an unqualified spare cannot stand in, so a fault
    meeting it would be answered with a requeue rather than a step retried in place."""
    from hyperpod_agent.controller.config import load_config

    config = load_config(cluster.services.controller_config_path())
    if not config.deep_checks.spare_gate_on:
        return 0.0
    t0 = time.monotonic()
    wait_for("the spares' deep checks", timeout, lambda: spares_qualified(cluster), 0.5)
    return time.monotonic() - t0
