"""A seeded chaos campaign on a busy HA local cluster, judged by an independent checker.

One local cluster with ``--ha`` (PostgreSQL, two controllers, an agent per node; 4 nodes
and 2 spares) at the shipped policy, kept busy by a bounded workload: toy training jobs
whose step runs under ``srun --auto-resume=1``, toy jobs with ``sbatch --auto-resume=1``
and plain jobs; an admin drains a node with their own reason for the first half of the
run. Faults are drawn with the seed at ``--rate`` per minute (exponential gaps) from the
catalogue below, each on a node (or controller) drawn at random, and heal as their
scenario says. Every 2 s the driver samples Slurm (``scontrol show node/job/res -o``),
the controllers' processes and the leader's status; at the end it reads slurmctld's log,
the job outputs and the product's event log, and bench/chaos_check.py judges them: the
event log is checked against Slurm, never trusted.

    .venv/bin/python bench/chaos.py --minutes 10 --seed 1

Faults (``--faults`` picks a subset; bench/chaos_faults.py lists them with their heals):
XIDs of four classes, NIC link down, scratch disk read-only or full, slurmd kill, node
crash, agent kill, munged kill, leader kill, leader SIGSTOP for 2 x its lease,
PostgreSQL restart, slurmctld restart, a training job's ranks frozen on one node (a
hang), XID 79 on two nodes of one job within a second.

Exit status 1 when the checker found a violation; the last line replays the campaign.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos_evidence import (  # noqa: E402
    AdminAction,
    Injection,
    JobSample,
    NodeSample,
    ProcessSample,
    ReservationSweep,
    StatusSample,
)
from bench.chaos_faults import FAULTS, Heal, Injector  # noqa: E402
from bench.chaos_judge import HYPERPOD, judge, run  # noqa: E402
from bench.chaos_parse import (  # noqa: E402
    parse_jobs,
    parse_nodes,
    parse_reservations,
    status_sample,
)
from hyperpod_agent.controller.config import load_config  # noqa: E402
from hyperpod_agent.errors import HyperpodError  # noqa: E402
from hyperpod_agent.localcluster import drill, ha  # noqa: E402
from hyperpod_agent.localcluster.cluster import LocalCluster  # noqa: E402

BASE = Path("/var/tmp/hyperpod-bench-chaos")
PORT_BASE = 19617
SAMPLE_S = 2.0
MAX_JOBS = 120  # the workload's bound, whatever the minutes
RUNNING_JOBS = 3  # submitted while fewer are pending or running
SETTLE_S = 240.0  # after the last fault: heal, let recoveries finish


@dataclass
class Campaign:
    cluster: LocalCluster
    rng: random.Random
    t0: float = field(default_factory=time.time)
    # Slurm and the controllers as sampled every SAMPLE_S
    nodes: list[NodeSample] = field(default_factory=list)
    jobs: list[JobSample] = field(default_factory=list)
    reservations: list[ReservationSweep] = field(default_factory=list)
    processes: list[ProcessSample] = field(default_factory=list)
    status: list[StatusSample] = field(default_factory=list)
    injections: list[Injection] = field(default_factory=list)
    admin: list[AdminAction] = field(default_factory=list)
    outputs: dict[int, Path] = field(default_factory=dict)
    auto_resume: set[int] = field(default_factory=set)
    submitted: int = 0
    one_job_steps: int = 0  # --workload one-job: its steps (0: the mixed workload)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- evidence ----------------------------------------------------------------------
    def sample(self) -> None:
        t = time.time()
        c = self.cluster
        nodes = parse_nodes(t, run(c, "scontrol", "show", "node", "-o"))
        jobs = parse_jobs(t, run(c, "scontrol", "show", "job", "-o"))
        res = parse_reservations(t, run(c, "scontrol", "show", "res", "-o"))
        procs = []
        for name in c.services.controllers:
            pid = c.services.pid(name)
            gauge = ha.leader_gauge(c.services.url_of(name))
            alive = pid is not None and _alive(pid)
            claimed = None if gauge is None else gauge == 1.0
            procs.append(ProcessSample(t, name, pid or 0, alive, claimed))
        # the controllers whose gauge says they lead first: a dead one is not asked twice
        ask = sorted(procs, key=lambda p: (not p.leader_claimed, not p.alive))
        status = self._status(t, [p.controller_id for p in ask if p.alive])
        with self.lock:
            self.nodes += nodes
            self.jobs += jobs
            self.reservations.append(res)
            self.processes += procs
            if status is not None:
                self.status.append(status)

    def _status(self, t: float, names: list[str]) -> StatusSample | None:
        """The leader's own answer: the live controllers asked in turn (the one
        claiming to lead first), a standby's answer (its own last pass) skipped. None:
        no leader answered this time, the checker sees the gap."""
        c = self.cluster
        for name in names:
            text = run(c, *HYPERPOD, "status", "--json", "--url", c.services.url_of(name))
            try:
                sample = status_sample(t, json.loads(text))
            except (ValueError, KeyError, TypeError):
                continue
            if sample is not None:
                return sample
        return None

    # -- workload ----------------------------------------------------------------------
    def keep_busy(self) -> None:
        """Submit a job while fewer than RUNNING_JOBS of ours are pending or running."""
        if self.submitted >= MAX_JOBS or (self.one_job_steps and self.submitted):
            return
        if self.one_job_steps:
            self._the_one_job()
            return
        text = run(self.cluster, "squeue", "-h", "-o", "%i %T")
        live = [line for line in text.splitlines() if line.split()[-1:] != ["COMPLETING"]]
        if len(live) >= RUNNING_JOBS:
            return
        kind = self.rng.choice(("in_place", "requeue", "plain"))
        self.submitted += 1
        if kind == "plain":
            run(self.cluster, "sbatch", "-N1", "--job-name=plain", "--wrap", "sleep 20")
            return
        script = "train_in_place.sbatch" if kind == "in_place" else "train.sbatch"
        job_id, out = drill.submit_training(
            self.cluster,
            steps=80,
            step_time=0.3,
            ckpt_every=5,
            auto_resume=None if kind == "in_place" else 1,
            script=script,
        )
        self.outputs[job_id] = out
        self.auto_resume.add(job_id)

    def _the_one_job(self) -> None:
        """One step-retry job on every node in service, as long as the campaign: the
        workload the simulator models, for the goodput beside its prediction."""
        job_id, out = drill.submit_training(
            self.cluster,
            steps=self.one_job_steps,
            step_time=0.3,
            ckpt_every=5,
            auto_resume=None,
            script="train_in_place.sbatch",
            extra=("--nodes", str(len(self.cluster.nodes))),
        )
        self.submitted += 1
        self.outputs[job_id] = out
        self.auto_resume.add(job_id)

    # -- faults ------------------------------------------------------------------------
    def inject(self, injector: Injector, kind: str, heal: Heal) -> None:
        self.injections += injector.inject(kind, self._in_service(), self._training(), heal)

    def _in_service(self) -> list[str]:
        """Nodes in service in the newest sweep (a spare put into service among them),
        the admin's own left out: a fault on a node already out would test nothing."""
        with self.lock:
            last = max((n.t for n in self.nodes), default=None)
            up = [n.node for n in self.nodes if n.t == last and not n.out]
        return [n for n in (up or self.cluster.nodes) if n not in self._admin_held()]

    def _training(self) -> list[tuple[int, tuple[str, ...]]]:
        """Our training jobs RUNNING in the newest sweep, with their nodes."""
        with self.lock:
            last = max((j.t for j in self.jobs), default=None)
            return [
                (j.job_id, j.nodes)
                for j in self.jobs
                if j.t == last and j.state == "RUNNING" and j.job_id in self.outputs
            ]

    def _admin_held(self) -> set[str]:
        return {a.node for a in self.admin if a.end is None}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


HEAL_AGAIN_S = 5.0


def heal_due(heal: Heal, now: float) -> None:
    """Run the heals that are due; one not done yet is tried again HEAL_AGAIN_S later."""
    for due, fn in [h for h in heal if h[0] <= now]:
        heal.remove((due, fn))
        if not fn():
            heal.append((now + HEAL_AGAIN_S, fn))


def clear_dir(path: Path) -> None:
    """Each campaign starts from nothing: a cluster left in ``path`` is stopped and the
    directory removed (job ids and checkpoint directories start again at 1). A
    directory that is not a local cluster's is refused, never removed."""
    if not path.exists():
        return
    if not (path / "cluster.json").exists() and any(path.iterdir()):
        raise SystemExit(f"chaos: {path} is not a local cluster directory; choose another --dir")
    if (path / "cluster.json").exists():
        try:
            LocalCluster.load(path).down()
        except Exception as exc:  # noqa: BLE001 - a broken leftover is removed all the same
            print(f"  clearing {path}: {exc}", flush=True)
    shutil.rmtree(path)


def campaign(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    clear_dir(args.dir)
    cluster = LocalCluster(args.dir, nodes=4, spares=2, port_base=args.port_base, ha=True)
    cluster.up(timeout=120, services=True)
    try:
        return _campaign(cluster, rng, args)
    finally:
        if not args.keep:
            cluster.down()


def _campaign(cluster: LocalCluster, rng: random.Random, args: argparse.Namespace) -> int:
    c = Campaign(cluster, rng)
    if args.workload == "one-job":  # its steps last the campaign at 0.3 s each
        c.one_job_steps = int(args.minutes * 60 / 0.3)
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            try:
                c.sample()
            except Exception as exc:  # noqa: BLE001 - one lost sample, said
                print(f"  sample failed: {exc}", flush=True)
            stop.wait(SAMPLE_S)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        # The admin's own drain of a node, for the first half of the run (not under the
        # one job, which needs every node).
        held = rng.choice(sorted(cluster.nodes))
        if not c.one_job_steps:
            admin = "reason=admin: firmware update"
            run(cluster, "scontrol", "update", f"nodename={held}", "state=drain", admin)
            c.admin.append(AdminAction("drain", held, time.time(), None, admin[7:]))
        kinds = args.faults.split(",")
        first = cluster.services.controllers[0]
        lease = load_config(cluster.services.controller_config_path(first)).ha.lease_ttl_s
        injector = Injector(cluster, rng, lease)
        end = c.t0 + args.minutes * 60
        heal: Heal = []
        next_fault = time.time() + rng.expovariate(args.rate / 60)
        admin_back = c.t0 + args.minutes * 30
        while time.time() < end:
            try:
                c.keep_busy()
            except HyperpodError as exc:  # slurmctld restarting, munged gone: later
                print(f"  not submitted: {exc}", flush=True)
            now = time.time()
            if c.admin and c.admin[0].end is None and now >= admin_back:
                run(cluster, "scontrol", "update", f"nodename={held}", "state=resume")
                c.admin[0] = AdminAction(
                    "drain", held, c.admin[0].start, time.time(), c.admin[0].reason
                )
            heal_due(heal, now)
            if now >= next_fault:
                kind = rng.choice(kinds)
                print(f"  +{now - c.t0:6.1f} s {kind}", flush=True)
                try:
                    c.inject(injector, kind, heal)
                except Exception as exc:  # noqa: BLE001 - a fault that could not land
                    print(f"    not injected: {exc}", flush=True)
                next_fault = now + rng.expovariate(args.rate / 60)
            time.sleep(0.5)
        settle = time.time() + SETTLE_S
        # Settled: every fault healed, every slurmd back, no job left (COMPLETING ones
        # included: squeue lists them).
        while time.time() < settle and (heal or _live_jobs(cluster) or _down(cluster)):
            heal_due(heal, time.time())
            time.sleep(1.0)
    finally:
        stop.set()
        thread.join(30)
    # The last word: a job that ended just before the settle loop looked is seen ended
    # (a sweep taken an instant before its end would leave it RUNNING for the checker).
    time.sleep(SAMPLE_S)
    c.sample()
    report, violations = judge(c, args)
    print(report, flush=True)
    return 1 if violations else 0


def _live_jobs(cluster: LocalCluster) -> bool:
    return bool(run(cluster, "squeue", "-h", "-o", "%i").strip())


def _down(cluster: LocalCluster) -> list[str]:
    return [n for n in [*cluster.nodes, *cluster.spares] if cluster.slurmd_pid(n) is None]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rate", type=float, default=1.0, help="faults per minute")
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--dir", type=Path, default=BASE)
    ap.add_argument("--port-base", type=int, default=PORT_BASE)
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument(
        "--workload",
        choices=("mixed", "one-job"),
        default="mixed",
        help="mixed: training, requeue and plain jobs beside an admin's drain; one-job: "
        "one step-retry job on every node, its goodput beside the simulator's prediction",
    )
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
    if not 0 < args.minutes <= 120 or not 0 < args.rate <= 10:
        ap.error("--minutes in (0, 120], --rate in (0, 10]")
    if unknown := set(args.faults.split(",")) - set(FAULTS):
        ap.error(f"unknown faults {sorted(unknown)}; known: {','.join(FAULTS)}")
    print(f"chaos: seed {args.seed}, {args.minutes:g} min, {args.rate:g} faults/min", flush=True)
    return campaign(args)


if __name__ == "__main__":
    sys.exit(main())
