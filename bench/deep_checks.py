"""What a deep check of the spares buys: recovery with a broken spare in the pool.

One local cluster (2 nodes in service, 2 spares: node3 broken, node4 good; the broken
one's DCGM diagnostic fails, its agent's passive probes see nothing) and one 2-node
auto-resume training job per trial. XID 79 on one of the job's nodes, then:

  no-check      gates off: the broken spare (first in the pool) is swapped in; the job
                runs on it until its GPU fails (injected as soon as the job runs there,
                the best case), a second recovery brings in the good spare;
  pre-qualified gate_spares: the spares were checked before the fault; the broken one
                is held, the good one is swapped in at once;
  check-at-swap the swap waits for the spare's check: the pre-qualified recovery plus
                the measured duration of a check run on the spares (composed, not a
                controller mode: the controller never makes a swap wait for a check).

Prints, per mode, the median (and max) of fault -> job running again on healthy nodes,
and the recoveries (requeues) the job paid. The fake DCGM diagnostic takes
``--dcgm-seconds`` (a real ``dcgmi diag -r 2`` takes about two minutes).

    .venv/bin/python bench/deep_checks.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from hyperpod_agent.localcluster import deepchecks, drill, reset
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient

BASE = Path("/var/tmp/hyperpod-bench-deepcheck")
BROKEN, GOOD = "node3", "node4"
# With the local cluster's suite both gates are on by default: each mode says what it
# measures. Re-entry plays no part here (the victim is held for repair).
NO_GATES = {"gate_reentry": False, "gate_spares": False}
GATED = {"gate_reentry": False, "gate_spares": True}


def hyperpod_json(cluster: LocalCluster, *args: str) -> Any:
    env = {**cluster.env, "HYPERPOD_LOCAL_CLUSTER_DIR": str(cluster.dir)}
    res = subprocess.run(
        [sys.executable, "-m", "hyperpod_agent", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=True,
    )
    return json.loads(res.stdout)


def prepare(cluster: LocalCluster, gates: dict[str, Any], dcgm_s: float) -> float:
    """A clean cluster with the broken spare; with gates, wait for the spares'
    qualification and return how long their check run took (planned -> done)."""
    # The last trial's controller goes first: with its gates on, the spares drained
    # back into the pool by the reset would start a run that the fresh state forgets.
    cluster.services.stop("controller")
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    for job in slurm.list_jobs(all_states=False):
        slurm.cancel(job.job_id)
    reset.reset_cluster(cluster)
    for resv in slurm.reservations():
        if resv.name.startswith("hyperpod-check-"):
            slurm.delete_reservation(resv.name)
    broken = {"dcgmi": {"delay_s": dcgm_s, "fail": [{"test": "memory", "gpu": 3}]}}
    nodes = {n: {"dcgmi": {"delay_s": dcgm_s}} for n in cluster.shape.all_names}
    deepchecks.write_scenario(cluster.dir, {**nodes, BROKEN: broken})
    reset.fresh_controller(cluster, deep_checks=gates)
    if not gates["gate_spares"]:
        return 0.0
    drill.wait_for(
        "the spares qualified",
        120,
        lambda: (
            slurm.node(BROKEN).reason.startswith("hyperpod:hold deep-check")
            and slurm.node(GOOD).reason == "hyperpod:spare"
            and any(r["phase"] == "done" for r in hyperpod_json(cluster, "checks"))
        ),
        interval=0.5,
    )
    [run] = [r for r in hyperpod_json(cluster, "checks") if r["phase"] == "done"]
    took = datetime.fromisoformat(run["updated_at"]) - datetime.fromisoformat(run["created_at"])
    return took.total_seconds()


def trial(cluster: LocalCluster) -> tuple[float, int]:
    """One fault; (seconds to running again on healthy nodes, requeues paid)."""
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    job_id, out = drill.submit_training(cluster, steps=600, step_time=0.25, ckpt_every=5)
    drill.wait_for(
        f"job {job_id} at step 6",
        120,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= 6,
    )
    job = slurm.job(job_id)
    assert job is not None
    victim = sorted(job.nodes)[-1]
    fault_at = drill.inject_xid(cluster, victim)
    broke_spare = False
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        job = slurm.job(job_id)
        assert job is not None
        if job.state == "RUNNING" and job.restart_count >= 1:
            if BROKEN in job.nodes and not broke_spare:
                drill.inject_xid(cluster, BROKEN)  # what its failed diagnostic foretold
                broke_spare = True
            elif BROKEN not in job.nodes and victim not in job.nodes:
                took = time.time() - fault_at
                slurm.cancel(job_id)
                return took, job.restart_count
        time.sleep(0.1)
    raise RuntimeError(f"job {job_id} not running on healthy nodes within 240 s")


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):6.2f} s  max {max(values):6.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="faults per mode")
    parser.add_argument("--dcgm-seconds", type=float, default=10.0)
    args = parser.parse_args()
    cluster = LocalCluster(BASE, nodes=2, spares=2, port_base=21717)
    cluster.up(timeout=60, services=True)
    results: dict[str, list[tuple[float, int]]] = {"no-check": [], "pre-qualified": []}
    check_runs: list[float] = []
    try:
        for i in range(args.runs):
            prepare(cluster, NO_GATES, args.dcgm_seconds)
            results["no-check"].append(trial(cluster))
            print(f"  no-check #{i + 1}: {results['no-check'][-1]}", flush=True)
            check_runs.append(prepare(cluster, GATED, args.dcgm_seconds))
            results["pre-qualified"].append(trial(cluster))
            print(
                f"  pre-qualified #{i + 1}: {results['pre-qualified'][-1]} "
                f"(check run {check_runs[-1]:.0f} s)",
                flush=True,
            )
    finally:
        cluster.down()
    ahead = [t for t, _ in results["pre-qualified"]]
    at_swap = [t + c for t, c in zip(ahead, check_runs, strict=True)]
    rows = {
        "no-check": ([t for t, _ in results["no-check"]], [n for _, n in results["no-check"]]),
        "pre-qualified": (ahead, [n for _, n in results["pre-qualified"]]),
        "check-at-swap": (at_swap, [n for _, n in results["pre-qualified"]]),
    }
    print(
        f"\nfault -> running again on healthy nodes ({args.runs} faults per mode, "
        f"fake dcgmi diag {args.dcgm_seconds:g} s, a broken spare first in the pool)"
    )
    for mode, (times, requeues) in rows.items():
        print(f"  {mode:14s} {summary(times)}  requeues {statistics.median(requeues):.0f}")
    base = statistics.median(ahead)
    for mode in ("no-check", "check-at-swap"):
        print(f"  {mode} / pre-qualified: {statistics.median(rows[mode][0]) / base:.2f}x")
    print(f"  check run on the spares: {summary(check_runs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
