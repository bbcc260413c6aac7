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
ratio reference / hyperpod.

    .venv/bin/python bench/hang.py --runs 10
"""

from __future__ import annotations

import argparse
import json
import os
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


def one_trial(cluster: LocalCluster, i: int) -> dict[str, float]:
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
        drill.freeze_ranks(cluster, job_id, sorted(job.nodes)[-1])
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cluster-dir", type=Path, default=BASE)
    args = parser.parse_args()
    cluster = LocalCluster(args.cluster_dir, nodes=4, spares=1, port_base=21717)
    cluster.up(timeout=60, services=True)
    trials: list[dict[str, float]] = []
    try:
        for i in range(args.runs):
            reset.reset_cluster(cluster)
            t = one_trial(cluster, i)
            print(f"  hang #{i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.items()))
            trials.append(t)
    finally:
        cluster.down()
    print(f"\nhang -> ... over {len(trials)} frozen ranks (toy step {STEP_S} s; median, p90)")
    medians = {}
    for phase in ("detected", "running_again", "first_new_step"):
        values = [t[phase] for t in trials if phase in t]
        if not values:
            print(f"  {phase:16s} never seen")
            continue
        med, p90 = summary(values)
        medians[phase] = med
        print(f"  {phase:16s} {med:7.2f} s  p90 {p90:7.2f} s  ({len(values)}/{len(trials)})")
    if "detected" in medians:
        print("\nreference (stock Slurm: nothing notices; the job waits for its timeout)")
        for name, seconds in REFERENCES:
            print(f"  {name:52s} {seconds:7.0f} s  = {seconds / medians['detected']:6.0f}x")
    return 0 if all(len(t) == 3 for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
