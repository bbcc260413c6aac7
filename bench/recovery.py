"""Fault -> drained -> requeued -> running again -> first new step, side by side.

Ways to recover the same 2-node training job, each on its own local cluster, in one
run:

  step-retry      controller + agents, a spare ready; examples/train_in_place.sbatch,
                  whose step runs under srun --auto-resume=1: the step ends, the node
                  goes out, the spare is merged into the same job and the step runs
                  again (no requeue: "requeued" stays empty); XID 79 as below;
  hyperpod        controller + agents, a spare ready, cred_expire=5 (Slurm's minimum);
                  examples/train.sbatch with sbatch --auto-resume=1 (job-level requeue);
                  the fault: XID 79 injected into the fake GPU scenario of one of the
                  job's nodes (the GPU is gone; Slurm alone never notices);
  native-tuned    no hyperpod services, `sbatch --requeue`, one of the job's nodes
                  fails (its slurmd SIGKILLed), Slurm's own detection at the lab's
                  tuned timeouts (SlurmdTimeout=6, MessageTimeout=3), cred_expire=5;
  native-default  the same at Slurm's defaults (SlurmdTimeout=300, MessageTimeout=10,
                  cred_expire=120); these faults are injected in parallel on separate
                  jobs (each ~10 minutes), the others one after another.

With --busy the two hyperpod modes run again on a busy cluster: before each fault a
job that wants more whole nodes than are free (sbatch --exclusive, sleeping
--busy-hold-s) waits in the same partition, as a full cluster's queue would. A
requeued job queues behind it; a step retried in place never leaves its allocation.

Prints medians (and p90) per phase and the ratios native / hyperpod.

    .venv/bin/python bench/recovery.py                  # 10 faults per mode
    .venv/bin/python bench/recovery.py --runs 10 --skip-default --busy
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hyperpod_agent.localcluster import drill, reset
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient

PHASES = ("drained", "requeued", "running_again", "first_new_step")
BASE = Path("/var/tmp/hyperpod-bench-recovery")


def _job_on_two(
    cluster: LocalCluster, native: bool, tag: str, steps: int = 400, in_place: bool = False
) -> tuple[int, Path, str]:
    env = {"HYPERPOD_CHECKPOINT_DIR": str(cluster.dir / "checkpoints" / tag)} if native else None
    job_id, out = drill.submit_training(
        cluster,
        steps=steps,
        step_time=0.25,
        ckpt_every=5,
        auto_resume=None if native or in_place else 1,
        extra=("--requeue", "--exclusive") if native else (),
        env=env,
        script="train_in_place.sbatch" if in_place else "train.sbatch",
    )
    drill.wait_for(
        f"job {job_id} at step 6",
        120,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= 6,
    )
    job = SlurmClient(slurm_conf=cluster.slurm_conf).job(job_id)
    assert job is not None
    return job_id, out, sorted(job.nodes)[-1]


def hyperpod_runs(runs: int, in_place: bool, busy_s: float = 0.0) -> list[drill.Timeline]:
    """XID 79 on one node of the job; the job requeued, or (``in_place``) its step
    retried inside it. ``busy_s``: a job that wants more than the free nodes waits
    (for that long once it runs) before each fault."""
    name = ("step-retry" if in_place else "hyperpod") + ("-busy" if busy_s else "")
    port = {"hyperpod": 21517, "step-retry": 21617}[name.removesuffix("-busy")]
    cluster = LocalCluster(BASE / name, nodes=4, spares=1, port_base=port + (50 if busy_s else 0))
    cluster.up(timeout=60, services=True)
    timelines = []
    try:
        for i in range(runs):
            reset.reset_cluster(cluster)
            job_id, out, victim = _job_on_two(
                cluster, native=False, tag=f"hp{i}", in_place=in_place
            )
            if busy_s:
                _busy(cluster, busy_s)
            fault_at = drill.inject_xid(cluster, victim)
            if in_place:
                tl = drill.follow_step_retry(cluster, job_id, victim, fault_at, out)
            else:
                tl = drill.follow_recovery(cluster, job_id, victim, fault_at, out, timeout=600)
            print(f"  {name} xid79 #{i + 1}: {tl.offsets()}", flush=True)
            timelines.append(tl)
            SlurmClient(slurm_conf=cluster.slurm_conf).cancel(job_id)
    finally:
        cluster.down()
    return timelines


def _busy(cluster: LocalCluster, hold_s: float) -> int:
    """A job wanting one whole node more than are free: it waits, first in line."""
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf)
    free = len(cluster.nodes) - 2
    res = subprocess.run(
        ["sbatch", "--parsable", "--exclusive", f"-N{free + 1}", "-o", "/dev/null",
         "--wrap", f"sleep {hold_s:g}"],
        capture_output=True, text=True, timeout=30, env=cluster.env, check=True,
    )  # fmt: skip
    job_id = int(res.stdout.strip().split(";")[0])
    drill.wait_for(
        "the competing job to wait", 30, lambda: (j := slurm.job(job_id)) and j.state == "PENDING"
    )
    return job_id


def native_runs(runs: int, default: bool) -> list[drill.Timeline]:
    timing = (
        dict(slurmd_timeout=300, message_timeout=10, cred_expire=120)
        if default
        else dict(slurmd_timeout=6, message_timeout=3, cred_expire=5)
    )
    # Room for every requeued job beside the dead nodes, as hyperpod has its spare.
    nodes = 3 * runs + 2 if default else 4
    name = "native-default" if default else "native-tuned"
    cluster = LocalCluster(
        BASE / name, nodes=nodes, spares=0, port_base=22517 if default else 23517, **timing
    )
    cluster.up(timeout=120)
    timelines: list[drill.Timeline] = []
    try:
        batch = runs if default else 1  # the default timeouts take minutes: inject at once
        done = 0
        while done < runs:
            # At Slurm's defaults the node is declared dead after 5-8 minutes: the
            # job must outlive that (its tasks live on while only slurmd is dead).
            started = [
                _job_on_two(
                    cluster, native=True, tag=f"{name}-{done + k}", steps=6000 if default else 400
                )
                for k in range(min(batch, runs - done))
            ]
            recoveries = []
            for job_id, out, victim in started:
                fault_at = time.time()
                cluster.node_kill(victim)  # slurmd dies; Slurm must notice by itself
                recoveries.append(drill.Recovery(job_id, victim, out, drill.Timeline(fault_at)))
            for tl in drill.follow_all(cluster, recoveries, timeout=1200):
                print(f"  {name} #{len(timelines) + 1}: {tl.offsets()}", flush=True)
                timelines.append(tl)
            slurm = SlurmClient(slurm_conf=cluster.slurm_conf)
            for job_id, _, victim in started:
                slurm.cancel(job_id)
                cluster.node_start(victim)
            cluster.wait_idle(cluster.nodes, timeout=120)
            done += len(started)
    finally:
        cluster.down()
    return timelines


def summary(timelines: list[drill.Timeline]) -> dict[str, tuple[float, float]]:
    out = {}
    for phase in PHASES:
        values = sorted(v for t in timelines if (v := t.offsets()[phase]) is not None)
        if values:
            p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
            out[phase] = (statistics.median(values), p90)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument(
        "--skip-default", action="store_true", help="leave out native-default (about 10 minutes)"
    )
    ap.add_argument(
        "--only",
        choices=["step-retry", "hyperpod", "native-tuned", "native-default"],
        help="run one family of modes (the ratios need the hyperpod figures)",
    )
    ap.add_argument("--busy", action="store_true", help="the hyperpod modes on a busy cluster too")
    ap.add_argument("--busy-hold-s", type=float, default=60.0, help="the competing job's run")
    args = ap.parse_args()
    modes: dict[str, Callable[[], list[drill.Timeline]]] = {
        "step-retry xid79 (srun --auto-resume)": lambda: hyperpod_runs(args.runs, True),
        "hyperpod xid79 (cred_expire 5)": lambda: hyperpod_runs(args.runs, False),
        "native-tuned slurmd killed (6/3, cred_expire 5)": lambda: native_runs(args.runs, False),
    }
    if args.busy:
        hold = args.busy_hold_s
        modes["step-retry xid79, busy cluster"] = lambda: hyperpod_runs(args.runs, True, hold)
        modes["hyperpod xid79, busy cluster"] = lambda: hyperpod_runs(args.runs, False, hold)
    if not args.skip_default:
        modes["native-default slurmd killed (300/10, cred_expire 120)"] = lambda: native_runs(
            args.runs, True
        )
    if args.only:
        modes = {k: v for k, v in modes.items() if k.split(" ")[0] == args.only}
    results: dict[str, dict[str, tuple[float, float]]] = {}
    # The default timeouts make a recovery take ~10 minutes of waiting: that mode runs
    # on its own cluster in a background thread while the others run one by one.
    slow = {k: v for k, v in modes.items() if k.startswith("native-default")}
    threads = []
    for label, run in slow.items():
        print(f"{label}: started in the background", flush=True)
        t = threading.Thread(target=lambda lb=label, r=run: results.__setitem__(lb, summary(r())))
        t.start()
        threads.append(t)
    for label, run in modes.items():
        if label in slow:
            continue
        print(f"{label}:", flush=True)
        results[label] = summary(run())
    for t in threads:
        t.join()
    print(f"\nmedian (p90) seconds after the fault, {args.runs} faults per mode")
    print(f"{'mode':<54}" + "".join(f"{p:>18}" for p in PHASES))
    for label in modes:
        res = results.get(label, {})
        cells = "".join(
            f"{res[p][0]:>9.2f} ({res[p][1]:>5.1f})" if p in res else f"{'-':>18}" for p in PHASES
        )
        print(f"{label:<54}{cells}")
    base = results.get("hyperpod xid79 (cred_expire 5)")
    if base is None:
        return 0
    print("\nratio to hyperpod's requeue, fault -> running again and -> first new step:")
    for label, res in results.items():
        if label != "hyperpod xid79 (cred_expire 5)":
            ratios = [
                f"{res[p][0] / base[p][0]:.1f}x"
                for p in ("running_again", "first_new_step")
                if p in res and p in base and base[p][0] > 0
            ]
            print(f"  {label}: {', '.join(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
