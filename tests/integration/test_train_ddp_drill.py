"""A real PyTorch DDP job (examples/train_ddp.sbatch: gloo on CPU, one rank per node,
``srun --auto-resume=1``) on the local service cluster, its step retried in place:

- XID 79 on one of its nodes: the step runs again without the node, on a spare, and
  the run ends bit for bit where an unfaulted run of the same seed ends;
- a rank frozen (SIGSTOP) in a 3-node job, the others blocked in their all-reduce: the
  hang is declared naming the frozen rank's node, the controller ends the step, and it
  runs again in the same job without that node.

The victim is drawn at random (seeded; the seed is printed, ``TRAIN_DDP_DRILL_SEED``
replays it) among all the job's nodes, its batch host included: a bad batch host stays
in the job, drained, and the step runs on the other nodes and the spare.

Every node's memory tier is a directory of its own (``--memory-per-node``: the local
cluster's nodes share one /dev/shm), so the spare that takes the victim's rank starts
without it and restores from the replica its peer holds.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_hang_drills import events, hyperpod
from test_step_retry_drills import spares_ready

from hyperpod_agent.localcluster import drill, reset
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient
from hyperpod_agent.slurm.hostlist import expand_hostlist
from hyperpod_agent.slurm.models import Job

try:
    import torch  # noqa: F401 - the job's python3 is this one
except ImportError:  # pragma: no cover - setup.sh installs it where it can
    pytest.skip("torch is not installed: train_ddp.py needs it", allow_module_level=True)

pytestmark = [pytest.mark.slurm, pytest.mark.services]

SCRIPT = "train_ddp.sbatch"
STEPS = 60
STEP_TIME = 0.25  # s of extra compute per step: the fault lands mid-run
PEER_PORT = 24960  # replica servers: PEER_PORT + index of the node in the step's list
WARM_STEPS = 5  # the straggler drill slows a rank once both ranks ran this many steps


@pytest.fixture
def cluster(service_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The service cluster as the step-retry drills leave it: reset, spares qualified."""
    reset.reset_cluster(service_cluster)
    spares_ready(service_cluster)
    yield service_cluster
    reset.reset_cluster(service_cluster)


def submit(
    cluster: LocalCluster,
    base: Path,
    seed: int,
    port: int,
    nodes: int = 2,
    steps: int = STEPS,
    auto_resume: int | None = None,
    step_time: float = STEP_TIME,
    burn: bool = False,
    peer_port: int = PEER_PORT,
    own_checkpoint_dir: bool = True,
) -> tuple[int, Path, Path]:
    """train_ddp.sbatch on ``nodes`` nodes; (job id, its output file, its --out directory).
    ``own_checkpoint_dir`` False: the SPANK plugin's ``<checkpoint_root>/<jobid>``, whose
    resume.json the controller reads, as a job submitted from the docs gets."""
    scratch = base / f"run-{time.time_ns()}"
    scratch.mkdir(mode=0o755)
    args = f"--seed {seed} --eval-every 20 --threads 1" + (" --burn" if burn else "")
    ckpt = base / f"ckpt-{time.time_ns()}" if own_checkpoint_dir else None
    env = drill.ddp_env(scratch, port, args, ckpt, peer_port)
    job_id, out = drill.submit_training(
        cluster,
        steps=steps,
        step_time=step_time,
        ckpt_every=10,
        auto_resume=auto_resume,  # None: the srun inside opts in
        script=SCRIPT,
        extra=("--nodes", str(nodes)),
        env=env,
    )
    return job_id, out, scratch / "out"


def seeded(what: str) -> tuple[int, random.Random, Path]:
    """The drill's seed (printed; TRAIN_DDP_DRILL_SEED replays it), its draws, a scratch dir."""
    seed = int(os.environ.get("TRAIN_DDP_DRILL_SEED") or random.SystemRandom().randrange(2**31))
    print(f"{what} seed {seed} (TRAIN_DDP_DRILL_SEED={seed} replays it)")
    base = Path(os.environ.get("TMPDIR", "/var/tmp")) / f"hp-ddp-{time.time_ns()}"
    base.mkdir(mode=0o755)
    return seed, random.Random(seed), base


def reach(cluster: LocalCluster, job_id: int, out: Path, step: int) -> Job:
    """The job once rank 0 printed ``step``."""
    drill.wait_for(
        f"job {job_id} to reach step {step}",
        180,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= step,
    )
    return drill.job_of(cluster, job_id)


def losses(out_dir: Path) -> dict[int, str]:
    got: dict[int, str] = {}
    for line in (out_dir / "losses.txt").read_text().splitlines():
        step, value = line.split()
        assert got.setdefault(int(step), value) == value, f"step {step} computed twice, differently"
    return got


def test_xid79_on_a_ddp_job_resumes_bit_for_bit(cluster: LocalCluster, tmp_path: Path) -> None:
    seed, rng, base = seeded("train_ddp drill")

    # The unfaulted run, same seed.
    ref_id, ref_out, ref_dir = submit(cluster, base, seed, 29610)
    ref = drill.wait_job_end(cluster, ref_id, timeout=300)
    assert ref.state == "COMPLETED", ref_out.read_text()[-3000:]
    want_hash = (ref_dir / "params.sha256").read_text().strip()
    want_losses = losses(ref_dir)
    assert sorted(want_losses) == list(range(1, STEPS + 1))

    # The faulted run.
    job_id, out, out_dir = submit(cluster, base, seed, 29620)
    job = reach(cluster, job_id, out, 15)
    victim = rng.choice(sorted(job.nodes))
    print(f"XID 79 on {victim} (of {sorted(job.nodes)}; batch host {job.batch_host})")
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


def test_a_frozen_rank_of_a_ddp_job_ends_its_step_and_it_runs_again_without_it(
    cluster: LocalCluster,
) -> None:
    seed, rng, base = seeded("train_ddp hang drill")
    steps = 80
    job_id, out, out_dir = submit(cluster, base, seed, 29630, nodes=3, steps=steps)
    job = reach(cluster, job_id, out, 20)  # past min_steps: the judge has the job's pace
    victim = rng.choice(sorted(job.nodes))
    print(f"SIGSTOP of the rank on {victim} (of {sorted(job.nodes)}; batch host {job.batch_host})")
    drill.freeze_ranks(cluster, job_id, victim)
    done = drill.wait_job_end(cluster, job_id, timeout=300)
    text = out.read_text()
    assert done.state == "COMPLETED", text[-3000:]
    assert done.job_id == job_id and done.restart_count == 0, "never requeued: same job, Restarts=0"
    [hang] = events(cluster, "hang", job_id)
    assert f"suspect {victim} ({victim}: rank" in hang["message"], hang
    ends = events(cluster, "step_end", job_id)
    assert ends and "hang:" in ends[0]["message"], ends
    retried = events(cluster, "step_retry_done", job_id)
    assert len(retried) == 1, retried
    log = drill.parse_train_log(text)
    assert len(log.attempts) == 2, text[-3000:]
    assert victim not in log.attempts[1].nodes
    last_before = max(s for s, _ in log.attempts[0].steps)
    resumed = log.attempts[1].resumed_from
    assert resumed is not None and resumed >= last_before - 1, (
        f"resumed from {resumed}, the first attempt had reached {last_before} (at most 1 behind)"
    )
    assert sorted(losses(out_dir)) == list(range(1, steps + 1))  # every step, each one way
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    assert slurm.node(victim).reason.startswith(f"hyperpod:replace job{job_id} hang")


def test_a_dead_node_of_a_ddp_job_requeues_it_and_it_resumes_where_it_was(
    cluster: LocalCluster,
) -> None:
    """The documented fallback for a node that dies outright (docs/auto-resume.md): on
    Slurm 22.05 a dead node's step stays RUNNING on it even in a --no-kill job, so no
    step can be retried in place; the job is requeued (``sbatch --auto-resume=1``) and
    resumes from the newest step all ranks hold. Its cost is printed."""
    seed, rng, base = seeded("train_ddp dead-node drill")
    job_id, out, out_dir = submit(cluster, base, seed, 29640, auto_resume=1)
    job = reach(cluster, job_id, out, 15)
    victim = rng.choice(sorted(n for n in job.nodes if n != job.batch_host))
    print(f"node crash of {victim} (of {sorted(job.nodes)}; batch host {job.batch_host})")
    crashed_at = time.time()
    cluster.node_crash(victim)
    done = drill.wait_job_end(cluster, job_id, timeout=240)
    text = out.read_text()
    assert done.state == "COMPLETED", text[-3000:]
    assert done.restart_count == 1, "requeued once"
    log = drill.parse_train_log(text)
    before, after = log.attempts[0], log.attempts[-1]
    assert victim not in after.nodes
    last_before = max(s for s, _ in before.steps)
    assert after.resumed_from is not None and after.resumed_at is not None
    assert sorted(losses(out_dir)) == list(range(1, STEPS + 1))  # every step, each one way
    first_new = min(at for s, at in after.steps if s > after.resumed_from)
    print(
        f"dead node {victim}: running again +{after.started_at - crashed_at:.2f} s, "
        f"first new step +{first_new - crashed_at:.2f} s, "
        f"steps lost {last_before - after.resumed_from} (resumed from {after.resumed_from}, "
        f"reached {last_before})"
    )


def test_goodput_of_a_faulted_ddp_run_matches_a_hand_count(cluster: LocalCluster) -> None:
    """XID 79 on a random node of a running train_ddp job (batch host included), retried
    in place; once the job ended, ``hyperpod goodput --job J`` against a count by hand
    from the job's output and the fault's time: the time lost is from the injection to
    the first step after the one restored, plus the steps run again at the median step
    time; over the wall time Slurm shows. Within 2 %."""
    seed, rng, base = seeded("train_ddp goodput drill")
    steps = 200
    job_id, out, _ = submit(cluster, base, seed, 29650, steps=steps, own_checkpoint_dir=False)
    job = reach(cluster, job_id, out, 40)
    victim = rng.choice(sorted(job.nodes))
    print(f"XID 79 on {victim} (of {sorted(job.nodes)}; batch host {job.batch_host})")
    injected = time.time()
    drill.inject_xid(cluster, victim)
    done = drill.wait_job_end(cluster, job_id, timeout=240)
    text = out.read_text()
    assert done.state == "COMPLETED", text[-3000:]
    log = drill.parse_train_log(text)
    assert len(log.attempts) == 2, text[-3000:]
    first, again = log.attempts
    reached = max(s for s, _ in first.steps)
    resumed = again.resumed_from
    assert resumed is not None, text[-3000:]
    first_new = min(at for s, at in again.steps if s == resumed + 1)
    times = sorted(first.steps)
    step_s = statistics.median(b[1] - a[1] for a, b in zip(times, times[1:], strict=False))

    g = hyperpod(cluster, "goodput", "--job", str(job_id))
    lost = (first_new - injected) + (reached - resumed) * step_s
    hand = (g["wall_s"] - lost) / g["wall_s"]
    print(
        f"goodput: measured ETTR {g['ettr']:.4f}, by hand {hand:.4f} (wall {g['wall_s']:.1f} s, "
        f"lost by hand {lost:.2f} s: first new step +{first_new - injected:.2f} s, "
        f"{reached - resumed} step(s) again at {step_s:.3f} s); measured lost "
        + ", ".join(f"{c} {v['seconds']}" for c, v in g["lost"].items() if v["seconds"])
    )
    assert g["ettr"] == pytest.approx(hand, rel=0.02)
    [incident] = g["incidents"]
    assert incident["path"] == "step_retry" and incident["node"] == victim
    assert incident["phases"]["restart"]["complete"], incident
    assert incident["recomputed_steps"] == reached - resumed


def test_two_nodes_of_a_ddp_job_faulted_within_a_second_are_one_recovery(
    cluster: LocalCluster,
) -> None:
    """XID 79 on two of a 3-node train_ddp job's nodes (drawn at random, the batch host
    among them) within a second: one recovery, never two surgeries at once. A second
    fault seen before the spare joins rolls the retry back to one requeue naming why;
    the job ends with every step, each computed once."""
    seed, rng, base = seeded("train_ddp two-fault drill")
    job_id, out, out_dir = submit(cluster, base, seed, 29670, nodes=3, peer_port=24980)
    job = reach(cluster, job_id, out, 15)
    first, second = rng.sample(sorted(job.nodes), 2)
    print(f"XID 79 on {first} and {second} (of {sorted(job.nodes)}; batch host {job.batch_host})")
    at = drill.inject_xid(cluster, first)
    assert drill.inject_xid(cluster, second) - at < 1.0
    done = drill.wait_job_end(cluster, job_id, timeout=240)
    text = out.read_text()
    assert done.state == "COMPLETED", text[-3000:]
    mine = events_of(cluster, job_id)
    kinds = [str(e["kind"]) for e in mine]
    assert kinds.count("step_retry_planned") <= 1, kinds
    assert kinds.count("requeue") <= 1 and done.restart_count == kinds.count("requeue"), kinds
    if "requeue" in kinds:
        why = [
            e for e in mine if e["kind"] in ("step_retry_requeue", "step_retry_failed", "requeue")
        ]
        assert why and all(e.get("cause") for e in why), why
    assert sorted(losses(out_dir)) == list(range(1, STEPS + 1))  # each step, one way
    # A faulted node may run the job again only once it was rebooted and passed its
    # re-entry check (the local cluster's reboot clears the injected XID).
    last = drill.parse_train_log(text).attempts[-1]
    back = {
        e["node"]
        for e in hyperpod(cluster, "events", "--limit", "500")
        if e["kind"] == "deep_check_ok" and "(reentry," in str(e["message"])
    }
    assert {first, second} & set(expand_hostlist(last.nodes)) <= back, (last.nodes, back)


def events_of(cluster: LocalCluster, job_id: int) -> list[dict[str, object]]:
    return [e for e in hyperpod(cluster, "events", "--limit", "500") if e.get("job_id") == job_id]


@contextlib.contextmanager
def slowed(
    pids: list[int], share: float, period_s: float = 0.1, max_s: float = 240.0
) -> Iterator[None]:
    """Run ``pids`` at ``share`` of full speed: stopped for the rest of every period
    (SIGSTOP/SIGCONT), for at most ``max_s``; always continued at the end."""
    done = threading.Event()

    def cycle() -> None:
        end = time.monotonic() + max_s
        while not done.is_set() and time.monotonic() < end:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(period_s * (1.0 - share))
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            done.wait(period_s * share)

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(10)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def test_a_rank_slowed_to_60_percent_is_named_a_straggler_and_a_uniform_run_is_not(
    cluster: LocalCluster,
) -> None:
    """In a synchronous job every rank's step lasts as long as the slowest's: only the
    time each spends computing (train_ddp records it apart from the all-reduce) tells
    the slow one. Its compute is CPU work (``--burn``), slowed from outside to 60 % by
    a stop/continue duty cycle; a uniform run of 500 steps beside it names nobody."""
    seed, rng, base = seeded("train_ddp straggler drill")
    slow_id, slow_out, _ = submit(cluster, base, seed, 29650, steps=400, step_time=0.1, burn=True)
    even_id, _, _ = submit(
        cluster, base, seed, 29660, steps=500, step_time=0.02, peer_port=PEER_PORT + 10
    )
    try:
        # Slowed mid-run, as a straggler is: from a step both ranks reached (a rank's
        # record exists before its first step, while torch starts; the steps counted
        # from there would include the start).
        drill.wait_for(
            f"job {slow_id}'s ranks to reach step {WARM_STEPS}",
            120,
            lambda: (
                (r := drill.rank_records(cluster, slow_id))
                and len(r) == 2
                and all(x.step >= WARM_STEPS for recs in r.values() for x in recs)
            ),
        )
        records = drill.rank_records(cluster, slow_id)
        victim = rng.choice(sorted(records))
        [rank] = records[victim]
        print(f"{victim} (rank {rank.rank}, pid {rank.pid}) at 60 % from step {rank.step}")
        with slowed([rank.pid], 0.6):
            started = rank.step
            [found] = drill.wait_for(
                "the straggler declared", 120, lambda: events(cluster, "straggler", slow_id), 0.5
            )
            [now] = drill.rank_records(cluster, slow_id)[victim]
        assert found["node"] == victim and f"{victim} straggles" in found["message"], found
        assert now.step - started <= 30, f"named at step {now.step}, slowed from {started}"
        done = drill.wait_job_end(cluster, even_id, timeout=180)
        assert done.state == "COMPLETED", done
        assert events(cluster, "straggler", even_id) == []
    finally:
        for job_id in (slow_id, even_id):
            SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10).cancel(job_id)
