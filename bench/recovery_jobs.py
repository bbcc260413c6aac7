"""The jobs bench/recovery.py breaks, and how it follows one recovery.

Two trainers print the same lines (``drill.parse_train_log``):

  ddp  examples/train_ddp.sbatch running examples/train_ddp.py: PyTorch DDP, gloo on
       CPU, one rank per node, every step saved to the memory tier with a replica on
       the other node, every 10th to the persistent tier;
  toy  examples/train_in_place.sbatch / train.sbatch running examples/train_toy.py.

Three ways to run the job's step (``Flavour``):

  in-place  its srun under --auto-resume=1: the step retried inside the job;
  requeue   sbatch --auto-resume=1 and a plain srun: the job requeued as a whole;
  native    sbatch --requeue and a plain srun, for Slurm alone.

"Running again" is the new attempt's first line (rank 0 of the step launched again),
read from the job's output like the first new step: one clock for every mode, whatever
path the recovery took.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.localcluster import drill
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient
from hyperpod_agent.slurm.hostlist import expand_hostlist

Kind = Literal["ddp", "toy"]
Flavour = Literal["in-place", "requeue", "native"]
STEP_TIME = 0.25  # s of extra compute per step: a fault lands mid-run
# Steps before the fault: past the first persistent checkpoint (toy every 5, ddp every 10).
WARM = {"toy": 6, "ddp": 12}
CKPT_EVERY = {"toy": 5, "ddp": 10}


@dataclass(frozen=True)
class Started:
    job_id: int
    out: Path
    nodes: tuple[str, ...]  # sorted
    batch_host: str
    scratch: Path | None  # the ddp run's checkpoints and outputs, removed by ``end``


@dataclass(frozen=True)
class Outcome:
    victim: str
    timeline: drill.Timeline
    in_place: bool  # the same job id with Restarts=0 after the recovery
    steps_lost: int  # last step printed before the fault minus the step resumed from


def requeue_script(cluster: LocalCluster) -> Path:
    """train_ddp.sbatch with a plain srun, so only the job-level requeue (or Slurm's own
    --requeue) can bring it back: written beside the cluster, the example untouched. Its
    attempt number counts requeues, since no step-retry helper counts launches."""
    text = (drill.EXAMPLES / "train_ddp.sbatch").read_text()
    for old, new in (
        ("exec srun --auto-resume=1 bash", "exec srun bash"),
        ("${HYPERPOD_STEP_ATTEMPT:-0}", "${SLURM_RESTART_COUNT:-0}"),
    ):
        if text.count(old) != 1:  # the example changed shape: fail rather than mismeasure
            raise HyperpodError(f"train_ddp.sbatch: expected {old!r} exactly once")
        text = text.replace(old, new)
    shebang, rest = text.split("\n", 1)
    path = cluster.dir / "train_ddp_requeue.sbatch"
    path.write_text(f"{shebang}\n# bench/recovery.py's copy: a plain srun, no step retry\n{rest}")
    return path


def submit(
    cluster: LocalCluster,
    kind: Kind,
    flavour: Flavour,
    tag: str,
    port: int,
    steps: int = 400,
    job_auto_resume: bool = False,
) -> Started:
    """A 2-node job, once it has taken its first steps. ``port``: the ddp rendezvous;
    port + 1 and + 2 its replica servers. ``job_auto_resume``: sbatch --auto-resume=1
    on an in-place job too."""
    auto: int | None = 1 if flavour == "requeue" or job_auto_resume else None
    extra: tuple[str, ...] = ("--requeue", "--exclusive") if flavour == "native" else ()
    scratch = None
    if kind == "toy":
        script = "train_in_place.sbatch" if flavour == "in-place" else "train.sbatch"
        # Slurm alone has no SPANK plugin handing out a checkpoint directory.
        ckpt = cluster.dir / "checkpoints" / tag
        env = {"HYPERPOD_CHECKPOINT_DIR": str(ckpt)} if flavour == "native" else {}
    else:
        script = "train_ddp.sbatch" if flavour == "in-place" else str(requeue_script(cluster))
        scratch = cluster.dir / "ddp" / tag
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True, mode=0o755)
        env = drill.ddp_env(scratch, port, "--eval-every 0 --threads 1", scratch / "ckpt")
    job_id, out = drill.submit_training(
        cluster,
        steps=steps,
        step_time=STEP_TIME,
        ckpt_every=CKPT_EVERY[kind],
        auto_resume=auto,
        extra=extra,
        env=env,
        script=script,
    )
    warm = WARM[kind]
    drill.wait_for(
        f"job {job_id} at step {warm}",
        180,  # torch's import on a busy 2-core machine takes a while
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= warm,
        interval=0.2,
    )
    job = drill.job_of(cluster, job_id)
    return Started(job_id, out, tuple(sorted(job.nodes)), job.batch_host, scratch)


class Follow:
    """One fault being followed until its job takes a new step."""

    def __init__(self, started: Started, victim: str, fault_at: float) -> None:
        self.started = started
        self.victim = victim
        self.timeline = drill.Timeline(fault_at)
        self.restarts = 0

    def update(self, slurm: SlurmClient, now: float) -> Outcome | None:
        """Record what changed since the last look; the outcome once complete."""
        tl, st = self.timeline, self.started
        if tl.drained_at is None and drill.out_of_service(slurm, self.victim):
            tl.drained_at = now
        job = slurm.job(st.job_id)  # before the log: a job that ended wrote all of it
        if job is not None:
            self.restarts = job.restart_count
            if self.restarts and tl.requeued_at is None:
                tl.requeued_at = now
        log = drill.parse_train_log(st.out.read_text()) if st.out.exists() else None
        # The first attempt that started after the fault and took a step: one that
        # failed before its first step (a relaunch gone wrong) is part of the wait.
        later = [a for a in log.attempts if a.started_at > tl.fault_at and a.steps] if log else []
        if log is not None and later:
            again = later[0]
            tl.running_again_at = again.started_at
            tl.first_new_step_at = again.steps[0][1]
            tl.new_nodes = tuple(expand_hostlist(again.nodes))
            before = max(
                (s for a in log.attempts for s, at in a.steps if at <= tl.fault_at), default=0
            )
            # Steps the broken job printed after the fault cannot count: a GPU off the
            # bus computes none; resuming past ``before`` loses nothing.
            lost = max(0, before - (again.resumed_from or 0))
            return Outcome(self.victim, tl, self.restarts == 0, lost)
        if job is not None and job.state in drill.ENDED and not self.restarts:
            if now - tl.fault_at > 60:  # auto-resume requeues an ended job within seconds
                raise HyperpodError(f"job {st.job_id} ended {job.state} and was not requeued")
        return None


def follow_all(cluster: LocalCluster, follows: list[Follow], timeout: float) -> list[Outcome | str]:
    """Poll Slurm and the jobs' output until every job took a new step after its fault;
    an outcome per fault, or why it has none."""
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    results: dict[int, Outcome | str] = {}
    deadline = time.monotonic() + timeout
    while len(results) < len(follows):
        now = time.time()
        for i, f in enumerate(follows):
            if i in results:
                continue
            try:
                if (outcome := f.update(slurm, now)) is not None:
                    results[i] = outcome
            except HyperpodError as exc:
                results[i] = str(exc)
            if i not in results and time.monotonic() > deadline:
                results[i] = (
                    f"job {f.started.job_id}: no new step within {timeout:g} s "
                    f"(timeline so far: {f.timeline.offsets()})"
                )
        time.sleep(0.1)
    return [results[i] for i in range(len(follows))]


def end(cluster: LocalCluster, started: Started) -> None:
    """Cancel the job (its story is told) and remove what the ddp run wrote. A job that
    will not end is told, not raised: the next drill's reset cancels it again."""
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)

    def ended() -> bool:
        job = slurm.job(started.job_id)
        return job is None or job.state in drill.ENDED

    try:
        slurm.cancel(started.job_id)
        drill.wait_for(f"job {started.job_id} to end", 60, ended, interval=0.3)
    except HyperpodError as exc:
        print(f"  job {started.job_id} left running: {exc}", flush=True)
        return
    if started.scratch is not None:
        shutil.rmtree(started.scratch, ignore_errors=True)
