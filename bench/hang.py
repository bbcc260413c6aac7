"""A hung rank -> hang declared -> training running again, beside what stock Slurm and
a collective watchdog would take.

The job: examples/train.sbatch on 2 nodes with ``--sync`` (the ranks average their
gradients through files every step, so one frozen rank stops both, as an NCCL
collective would), ``--auto-resume=1``. The hang: one rank SIGSTOPped (no XID, no dead
link; the process simply stops). hyperpod: the ranks' progress records, the agents,
the controller's hang judgement, the requeue. Stock Slurm has nothing that notices;
the job waits for its collective timeout, so the reference rows are the timeouts
commonly configured (shown, not waited for): PyTorch's NCCL process-group default
(600 s), NVIDIA resiliency-ext's default in-job hang timeouts (2,700 s and 3,600 s).

Prints per trial and the median / p90 of: detected (freeze -> hang event),
running again (freeze -> the first line of the new attempt), first new step; and the
ratio reference / hyperpod. Each cadence gets its own cluster, side by side in one run:
``shipped`` (agents every 5 s, passes every 10 s, as an admin gets them) and ``drill``
(agents every 1 s, passes every 2 s, as the drills' local cluster runs). The frozen
rank is on a node of the job drawn at random (the batch host included; ``--seed``).

    .venv/bin/python bench/hang.py --runs 10 --cadences shipped,drill
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hyperpod_agent.localcluster import drill, reset
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient

BASE = Path("/var/tmp/hyperpod-bench-hang")
STEP_S = 0.3
REFERENCES = (
    ("torch NCCL process-group timeout (default)", 600.0),
    ("resiliency-ext in-job hang timeout (default, low)", 2700.0),
    ("resiliency-ext in-job hang timeout (default, high)", 3600.0),
)


def hang_events(cluster: LocalCluster, job_id: int) -> list[dict[str, Any]]:
    res = subprocess.run(
        [sys.executable, "-m", "hyperpod_agent", "events", "--limit", "200", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "HYPERPOD_LOCAL_CLUSTER_DIR": str(cluster.dir)},
    )
    if res.returncode != 0:
        return []
    return [e for e in json.loads(res.stdout) if e["kind"] == "hang" and e["job_id"] == job_id]


def one_trial(cluster: LocalCluster, i: int, rng: random.Random) -> dict[str, float]:
    sync = cluster.dir / "out" / f"bench-sync-{i}-{time.time_ns()}"
    sync.mkdir(parents=True)
    job_id, out = drill.submit_training(
        cluster, steps=400, step_time=STEP_S, ckpt_every=5, train_args=("--sync", str(sync))
    )
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf)
    try:
        drill.wait_for(
            f"job {job_id} at step 15",
            120,
            lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= 15,
        )
        job = slurm.job(job_id)
        assert job is not None
        frozen_at = time.time()
        drill.freeze_ranks(cluster, job_id, rng.choice(sorted(job.nodes)))
        times: dict[str, float] = {}
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(times) < 3:
            if "detected" not in times and hang_events(cluster, job_id):
                times["detected"] = time.time() - frozen_at
            log = drill.parse_train_log(out.read_text())
            if len(log.attempts) >= 2:
                again = log.attempts[1]
                times.setdefault("running_again", again.started_at - frozen_at)
                if again.steps:
                    times.setdefault("first_new_step", again.steps[0][1] - frozen_at)
            time.sleep(0.2)
        return times
    finally:
        slurm.cancel(job_id)


def summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return statistics.median(ordered), p90


def run_cadence(name: str, runs: int, base: Path, rng: random.Random) -> list[dict[str, float]]:
    shipped = name == "shipped"
    port = 21717 if shipped else 21817
    cluster = LocalCluster(base / name, nodes=4, spares=1, port_base=port, shipped_cadences=shipped)
    cluster.up(timeout=60, services=True)
    trials: list[dict[str, float]] = []
    try:
        for i in range(runs):
            reset.reset_cluster(cluster)
            t = one_trial(cluster, i, rng)
            print(f"  {name} hang #{i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.items()))
            trials.append(t)
    finally:
        cluster.down()
    return trials


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cadences", default="shipped,drill")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--cluster-dir", type=Path, default=BASE)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"seed {seed} (--seed {seed} replays the frozen nodes)")
    rng = random.Random(seed)
    results = {
        name: run_cadence(name, args.runs, args.cluster_dir, rng)
        for name in args.cadences.split(",")
    }
    bound = 2 * STEP_S * 1.1 + 10
    print(f"\nhang -> ... (toy step {STEP_S} s; median, p90, seen)")
    print(f"  {'cadence':8s} {'phase':16s} {'median':>8s} {'p90':>8s}  seen   bound")
    ok = True
    for name, trials in results.items():
        cycle = 5.0 if name == "shipped" else 1.0
        for phase in ("detected", "running_again", "first_new_step"):
            values = [t[phase] for t in trials if phase in t]
            if not values:
                print(f"  {name:8s} {phase:16s} never seen")
                ok = False
                continue
            med, p90 = summary(values)
            target = f"{bound + cycle:5.1f} s" if phase == "detected" else ""
            print(
                f"  {name:8s} {phase:16s} {med:6.2f} s {p90:6.2f} s"
                f"  {len(values)}/{len(trials)}  {target}"
            )
            if phase == "detected" and name == "shipped":
                print("\nreference (stock Slurm: nothing notices; the job waits for its timeout)")
                for ref, seconds in REFERENCES:
                    print(f"  {ref:52s} {seconds:7.0f} s  = {seconds / med:6.0f}x")
                print()
        ok = ok and all(len(t) == 3 for t in trials)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
