"""A real PyTorch DDP job (examples/train_ddp.sbatch: gloo on CPU, one rank per node,
``srun --auto-resume=1``) on the local service cluster: XID 79 on one of its nodes, the
step retried in place on a spare, and the run ends bit for bit where an unfaulted run
of the same seed ends.

The victim is drawn at random (seeded; the seed is printed, ``TRAIN_DDP_DRILL_SEED``
replays it) among the job's nodes that are not its batch host: Slurm cannot shrink a
running job off its batch host, so a fault there is mended by the job-level requeue,
the next rung (tests/integration/test_auto_resume.py), not by the retry in place this
drill is about. With 2 nodes that leaves one candidate; the draw matters on wider jobs.

Every node's memory tier is a directory of its own (``--memory-per-node``: the local
cluster's nodes share one /dev/shm), so the spare that takes the victim's rank starts
without it and restores from the replica its peer holds.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_step_retry_drills import spares_ready

from hyperpod_agent.localcluster import drill, reset
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient

try:
    import torch  # noqa: F401 - the job's python3 is this one
except ImportError:  # pragma: no cover - setup.sh installs it where it can
    pytest.skip("torch is not installed: train_ddp.py needs it", allow_module_level=True)

pytestmark = [pytest.mark.slurm, pytest.mark.services]

SCRIPT = "train_ddp.sbatch"
STEPS = 60
STEP_TIME = 0.25  # s of extra compute per step: the fault lands mid-run
PEER_PORT = 24960  # replica servers: PEER_PORT + index of the node in the step's list


@pytest.fixture
def cluster(service_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The service cluster as the step-retry drills leave it: reset, spares qualified."""
    reset.reset_cluster(service_cluster)
    spares_ready(service_cluster)
    yield service_cluster
    reset.reset_cluster(service_cluster)


def submit(cluster: LocalCluster, base: Path, seed: int, port: int) -> tuple[int, Path, Path]:
    """train_ddp.sbatch on 2 nodes; (job id, its output file, its --out directory)."""
    out_dir = base / f"out-{time.time_ns()}"
    args = (
        f"--peer-host 127.0.0.1 --memory-per-node {base / 'shm'} --seed {seed} "
        f"--eval-every 20 --threads 1 --out {out_dir}"
    )
    job_id, out = drill.submit_training(
        cluster,
        steps=STEPS,
        step_time=STEP_TIME,
        ckpt_every=10,
        auto_resume=None,  # the srun inside opts in
        script=SCRIPT,
        env={
            "TRAIN_SCRIPT": str(drill.EXAMPLES / "train_ddp.py"),
            "TRAIN_DDP_ARGS": args,
            "TRAIN_DDP_PEER_PORT": str(PEER_PORT),
            "MASTER_PORT": str(port),
            "HYPERPOD_CHECKPOINT_DIR": str(base / f"ckpt-{time.time_ns()}"),
        },
    )
    return job_id, out, out_dir


def losses(out_dir: Path) -> dict[int, str]:
    got: dict[int, str] = {}
    for line in (out_dir / "losses.txt").read_text().splitlines():
        step, value = line.split()
        assert got.setdefault(int(step), value) == value, f"step {step} computed twice, differently"
    return got


def test_xid79_on_a_ddp_job_resumes_bit_for_bit(cluster: LocalCluster, tmp_path: Path) -> None:
    seed = int(os.environ.get("TRAIN_DDP_DRILL_SEED", random.SystemRandom().randrange(2**31)))
    print(f"train_ddp drill seed {seed} (TRAIN_DDP_DRILL_SEED={seed} replays it)")
    rng = random.Random(seed)
    base = Path(os.environ.get("TMPDIR", "/var/tmp")) / f"hp-ddp-{time.time_ns()}"
    base.mkdir(mode=0o755)

    # The unfaulted run, same seed.
    ref_id, ref_out, ref_dir = submit(cluster, base, seed, 29610)
    ref = drill.wait_job_end(cluster, ref_id, timeout=300)
    assert ref.state == "COMPLETED", ref_out.read_text()[-3000:]
    want_hash = (ref_dir / "params.sha256").read_text().strip()
    want_losses = losses(ref_dir)
    assert sorted(want_losses) == list(range(1, STEPS + 1))

    # The faulted run.
    job_id, out, out_dir = submit(cluster, base, seed, 29620)
    drill.wait_for(
        f"job {job_id} to reach step 15",
        180,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= 15,
    )
    job = drill.job_of(cluster, job_id)
    candidates = sorted(n for n in job.nodes if n != job.batch_host)
    victim = rng.choice(candidates)
    print(f"XID 79 on {victim} (of {candidates}; batch host {job.batch_host})")
    before = drill.parse_train_log(out.read_text()).last_step
    drill.inject_xid(cluster, victim)
    done = drill.wait_job_end(cluster, job_id, timeout=300)
    text = out.read_text()
    assert done.state == "COMPLETED", text[-3000:]
    assert done.job_id == job_id and done.restart_count == 0, "never requeued: same job, Restarts=0"
    log = drill.parse_train_log(text)
    assert len(log.attempts) == 2, text[-3000:]
    last_before = max(s for s, _ in log.attempts[0].steps)
    resumed = log.attempts[1].resumed_from
    assert resumed is not None and resumed >= last_before - 1, (
        f"resumed from {resumed}, the first attempt had reached {last_before} (at most 1 behind)"
    )
    assert last_before >= before
    assert victim not in log.attempts[1].nodes
    assert "tier=peer" in text or "tier=memory" in text, "restored from a fast tier"
    # Bit for bit: the parameters' hash, and every loss (before the fault and after).
    assert (out_dir / "params.sha256").read_text().strip() == want_hash
    assert losses(out_dir) == want_losses
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    assert slurm.node(victim).reason.startswith("hyperpod:replace gpu3 xid79")
