"""Fault -> drained -> requeued -> running again -> first new step, side by side.

Ways to recover the same 2-node training job (bench/recovery_jobs.py: ``--job ddp``, a
PyTorch DDP run, by default; ``--job toy``), each on its own local cluster, in one run,
every fault on a fresh job:

  step-retry      controller + agents, a spare ready (deep-check qualified); the job's
                  step under srun --auto-resume=1 (examples/train_ddp.sbatch): the step
                  ends, the node goes out, the spare is merged into the same job and the
                  step runs again; the fault: XID 79 injected into the fake GPU scenario
                  of one of the job's nodes (the GPU is gone; Slurm alone never notices);
  requeue         the same services, the same job with sbatch --auto-resume=1 but a plain
                  srun: the job-level requeue handles the same XID 79;
  dead-node       step-retry's job, one of its nodes crashing (everything on it
                  SIGKILLed; never the batch host, whose death ends the job): the
                  controller answers REQUEUE (docs/auto-resume.md);
  native-tuned    no hyperpod services, `sbatch --requeue` and a plain srun, the slurmd
                  of one of the job's nodes SIGKILLed, Slurm's own detection at the lab's
                  tuned timeouts (SlurmdTimeout=6, MessageTimeout=3), cred_expire=5;
  native-default  the same at Slurm's defaults (SlurmdTimeout=300, MessageTimeout=10,
                  cred_expire=120); these faults are injected in parallel on separate
                  jobs (each ~10 minutes) while the others run one after another. On by
                  default for toy, off for ddp (--with-default / --skip-default).

The faulty node is drawn at random among the job's nodes, its batch host included
(dead-node: the others); ``--seed`` replays the draws. Each job is cancelled once it
took its first step after the recovery.

With --busy, step-retry and requeue run again on a busy cluster: before each fault a job
that wants more whole nodes than are free (sbatch --exclusive, sleeping --busy-hold-s)
waits in the same partition, as a full cluster's queue would. A requeued job queues
behind it; a step retried in place never leaves its allocation.

Prints every fault, then a markdown table per mode: faults, the share handled in place
(same job, Restarts=0), p50 (p90) seconds of each phase, steps lost per fault (p50 /
max; a fresh start loses them all), and the ratios to step-retry.

    .venv/bin/python bench/recovery.py                        # ddp, 20 faults per mode
    .venv/bin/python bench/recovery.py --job toy --runs 10 --skip-default --busy
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Siblings: the script's own directory is first on sys.path when it runs as a script.
import recovery_jobs as jobs
from recovery_jobs import Flavour, Follow, Kind, Outcome

from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.localcluster import drill, reset
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient

PHASES = ("drained", "requeued", "running_again", "first_new_step")
BASE = Path("/var/tmp/hyperpod-bench-recovery")
LABELS = {
    "step-retry": "step-retry: XID 79, srun --auto-resume=1",
    "requeue": "requeue: XID 79, sbatch --auto-resume=1",
    "dead-node": "dead-node: node crash, step-retry's job",
    "native-tuned": "native-tuned: slurmd killed (6/3 s, cred_expire 5)",
    "native-default": "native-default: slurmd killed (300/10 s, cred_expire 120)",
}
# Each mode's cluster and jobs get ports of their own: native-default runs beside the
# others, and the ranks of a node whose slurmd was killed outlive their job a moment.
CLUSTER_PORT = {"requeue": 21517, "step-retry": 21617, "dead-node": 21717,
                "native-default": 22517, "native-tuned": 23517}  # fmt: skip
JOB_PORT = {"step-retry": 26000, "requeue": 26200, "dead-node": 26400,
            "native-tuned": 26600, "native-default": 26800}  # fmt: skip
BUSY_OFFSET = 50  # cluster ports; the job ports add 1000


@dataclass
class Result:
    outcomes: list[Outcome] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the mode, its cluster's start and stop included

    def record(self, label: str, n: int, got: Outcome | str, batch_host: str) -> None:
        if isinstance(got, str):
            self.failures.append(got)
            print(f"  {label} #{n}: FAILED: {got}", flush=True)
            return
        self.outcomes.append(got)
        role = " (batch host)" if got.victim == batch_host else ""
        how = "in place" if got.in_place else "requeued"
        print(f"  {label} #{n}: {got.victim}{role} {how}, {got.steps_lost} steps lost, "
              f"{got.timeline.offsets()}", flush=True)  # fmt: skip


def job_port(mode: str, busy: bool, i: int) -> int:
    # 4 ports a job (rendezvous, 2 replica servers, one left free); after 50 faults a
    # port comes round again, long after its job ended.
    return JOB_PORT[mode] + (1000 if busy else 0) + 4 * (i % 50)


def service_runs(args: argparse.Namespace, mode: str, busy_s: float = 0.0) -> Result:
    """step-retry / requeue (XID 79) or dead-node (a crash) on a cluster with the
    hyperpod services, one fresh job per fault."""
    name = mode + ("-busy" if busy_s else "")
    kind: Kind = args.job
    flavour: Flavour = "requeue" if mode == "requeue" else "in-place"
    port = CLUSTER_PORT[mode] + (BUSY_OFFSET if busy_s else 0)
    rng = random.Random(f"{args.seed}/{name}")
    res, t0 = Result(), time.monotonic()
    cluster = LocalCluster(BASE / name, nodes=4, spares=1, port_base=port)
    cluster.up(timeout=60, services=True)
    try:
        for i in range(args.runs):
            pick = rng.random()  # drawn first: a failed run leaves the later draws alone
            started = None
            try:
                reset.reset_cluster(cluster)
                drill.wait_spares_ready(cluster)
                started = jobs.submit(
                    cluster, kind, flavour, f"{name}-{i}", job_port(mode, bool(busy_s), i),
                    job_auto_resume=mode == "dead-node",
                )  # fmt: skip
                pool = [n for n in started.nodes if mode != "dead-node" or n != started.batch_host]
                victim = pool[int(pick * len(pool))]
                if busy_s:
                    _busy(cluster, busy_s)
                if mode == "dead-node":
                    fault_at = time.time()
                    cluster.node_crash(victim)
                else:
                    fault_at = drill.inject_xid(cluster, victim)
                [got] = jobs.follow_all(cluster, [Follow(started, victim, fault_at)], 600)
            except HyperpodError as exc:
                got = str(exc)
            res.record(name, i + 1, got, started.batch_host if started else "")
            if started is not None:
                jobs.end(cluster, started)
    finally:
        cluster.down()
    res.seconds = time.monotonic() - t0
    return res


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


def native_runs(args: argparse.Namespace, default: bool) -> Result:
    """Slurm alone: a node's slurmd SIGKILLed, the job requeued by Slurm's --requeue."""
    # (SlurmdTimeout, MessageTimeout, cred_expire)
    slurmd_s, message_s, cred_s = (300, 10, 120) if default else (6, 3, 5)
    # Room for every requeued job beside the dead nodes, as hyperpod has its spare.
    nodes = 3 * args.runs + 2 if default else 4
    name = "native-default" if default else "native-tuned"
    rng = random.Random(f"{args.seed}/{name}")
    res, t0 = Result(), time.monotonic()
    cluster = LocalCluster(
        BASE / name,
        nodes=nodes,
        spares=0,
        port_base=CLUSTER_PORT[name],
        slurmd_timeout=slurmd_s,
        message_timeout=message_s,
        cred_expire=cred_s,
    )
    cluster.up(timeout=120)
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf)
    try:
        batch = args.runs if default else 1  # the default timeouts take minutes: at once
        done = 0
        while done < args.runs:
            ks = range(done, min(done + batch, args.runs))
            picks = [rng.random() for _ in ks]
            started: list[jobs.Started] = []
            follows: list[Follow] = []
            try:
                for k in ks:
                    # At Slurm's defaults the node is declared dead after 5-8 minutes: the
                    # job must outlive that (its tasks live on while only slurmd is dead).
                    started.append(jobs.submit(
                        cluster, args.job, "native", f"{name}-{k}", job_port(name, False, k),
                        steps=6000 if default else 400,
                    ))  # fmt: skip
                for st, pick in zip(started, picks, strict=True):
                    victim = st.nodes[int(pick * len(st.nodes))]
                    fault_at = time.time()
                    cluster.node_kill(victim)  # slurmd dies; Slurm must notice by itself
                    follows.append(Follow(st, victim, fault_at))
                got: list[Outcome | str] = jobs.follow_all(cluster, follows, 1200)
            except HyperpodError as exc:
                got = [str(exc)] * len(ks)
            hosts = [st.batch_host for st in started] + [""] * (len(ks) - len(started))
            for k, host, g in zip(ks, hosts, got, strict=True):
                res.record(name, k + 1, g, host)
            for st in started:
                jobs.end(cluster, st)
            for f in follows:
                cluster.node_start(f.victim)
            cluster.wait_idle(cluster.nodes, timeout=120)
            slurm.list_nodes()  # slurmctld still answers before the next batch
            done += len(ks)
    finally:
        cluster.down()
    res.seconds = time.monotonic() - t0
    return res


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def phase_stats(res: Result) -> dict[str, tuple[float, float]]:
    """phase -> (p50, p90) seconds after the fault, over the faults that reached it."""
    out = {}
    for phase in PHASES:
        values = [v for o in res.outcomes if (v := o.timeline.offsets()[phase]) is not None]
        if values:
            out[phase] = (statistics.median(values), pct(values, 0.9))
    return out


def report(args: argparse.Namespace, results: dict[str, Result]) -> None:
    """A markdown table: a row per mode."""
    stats = {m: phase_stats(r) for m, r in results.items()}
    base = stats.get("step-retry", {})
    head = ["mode", "faults", "in place", "drained", "requeued", "running again",
            "first new step", "steps lost p50 / max", "running again / step-retry",
            "first new step / step-retry", "s per fault"]  # fmt: skip
    print(f"\n{args.job}: p50 (p90) seconds after the fault; seed {args.seed}")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] + ["--:"] * (len(head) - 1)) + "|")
    for mode, res in results.items():
        st, ok = stats[mode], res.outcomes
        faults = len(ok) + len(res.failures)
        failed = f" ({len(res.failures)} failed)" if res.failures else ""
        cells = [LABELS[mode.removesuffix("-busy")] + (", busy" if mode.endswith("-busy") else ""),
                 f"{faults}{failed}",
                 f"{sum(o.in_place for o in ok)}/{len(ok)}" if ok else "-"]  # fmt: skip
        cells += [f"{st[p][0]:.1f} ({st[p][1]:.1f})" if p in st else "-" for p in PHASES]
        lost = [o.steps_lost for o in ok]
        cells.append(f"{statistics.median(lost):g} / {max(lost)}" if lost else "-")
        for p in ("running_again", "first_new_step"):
            has = p in st and p in base and base[p][0] > 0
            cells.append(f"{st[p][0] / base[p][0]:.1f}x" if has else "-")
        cells.append(f"{res.seconds / faults:.0f}" if faults else "-")
        print("| " + " | ".join(cells) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", choices=["ddp", "toy"], default="ddp", help="the job recovered")
    ap.add_argument("--runs", type=int, help="faults per mode (ddp 20, toy 10)")
    ap.add_argument("--seed", type=int, help="replays the faulty nodes drawn (printed)")
    default = ap.add_mutually_exclusive_group()
    default.add_argument("--with-default", action="store_true", help="run native-default")
    default.add_argument(
        "--skip-default", action="store_true", help="leave out native-default (~10 minutes)"
    )
    ap.add_argument("--only", choices=list(LABELS), help="run one mode (ratios need step-retry)")
    ap.add_argument("--busy", action="store_true", help="step-retry and requeue, busy cluster")
    ap.add_argument("--busy-hold-s", type=float, default=60.0, help="the competing job's run")
    args = ap.parse_args()
    if args.runs is None:
        args.runs = 20 if args.job == "ddp" else 10
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
    print(f"seed {args.seed} (--seed {args.seed} replays the faulty nodes)", flush=True)
    t0 = time.monotonic()
    modes: dict[str, Callable[[], Result]] = {
        "step-retry": lambda: service_runs(args, "step-retry"),
        "requeue": lambda: service_runs(args, "requeue"),
        "dead-node": lambda: service_runs(args, "dead-node"),
        "native-tuned": lambda: native_runs(args, False),
    }
    if args.busy:
        hold = args.busy_hold_s
        modes["step-retry-busy"] = lambda: service_runs(args, "step-retry", hold)
        modes["requeue-busy"] = lambda: service_runs(args, "requeue", hold)
    if args.with_default or (args.job == "toy" and not args.skip_default):
        modes["native-default"] = lambda: native_runs(args, True)
    if args.only:
        modes = {k: v for k, v in modes.items() if k.removesuffix("-busy") == args.only}
    results: dict[str, Result] = {}

    def run(mode: str) -> None:
        try:
            results[mode] = modes[mode]()
        except HyperpodError as exc:  # a cluster that would not start: the others go on
            print(f"{mode}: could not run: {exc}", flush=True)

    # The default timeouts make a recovery take ~10 minutes of waiting: that mode runs
    # on its own cluster in a background thread while the others run one by one.
    slow = [threading.Thread(target=run, args=("native-default",))] if (
        "native-default" in modes) else []  # fmt: skip
    for t in slow:
        print("native-default: started in the background", flush=True)
        t.start()
    for mode in modes:
        if mode != "native-default":
            print(f"{mode}:", flush=True)
            run(mode)
    for t in slow:
        t.join()
    report(args, {m: results[m] for m in modes if m in results})
    print(f"took {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
