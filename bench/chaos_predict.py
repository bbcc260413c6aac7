"""What the simulator predicts for a chaos campaign's one-job workload, to set beside
what the campaign measured: the same cluster (job nodes and spares), the same faults at
the same times on the same nodes, the same checkpoint interval and step time.

The simulator's component durations are the shipped ones (hyperpod_agent/simulate/
inputs.json: detection, drain, step restart, requeue, reboot, measured on this kind of
machine by the benchmarks), except what only the campaign's job knows: its step time and
its start (attempt start -> first step: process start, rendezvous, restore), taken from
the job's own output. Faults the simulator does not model (a controller, munged,
PostgreSQL or slurmctld, an agent killed) take no node out and are left out; a fault
on a node outside the job at that moment lands on a spare of the simulated pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from bench.chaos_evidence import Injection, JobSample, NodeSample, TrainOutput
from bench.chaos_faults import HEAL_S
from bench.chaos_measure import step_time
from hyperpod_agent.simulate.causes import CLASSES
from hyperpod_agent.simulate.faults import Fault
from hyperpod_agent.simulate.inputs import Distribution, Inputs, load_inputs
from hyperpod_agent.simulate.result import Result, Scenario, Strategy
from hyperpod_agent.simulate.run import simulate

# The driver's fault kinds that take a node out, as the simulator's fault classes.
KIND_CLASS = {
    "xid79": "gpu_xid",
    "double_xid": "gpu_xid",
    "xid48": "gpu_ecc",
    "xid94": "gpu_ecc",
    "xid63": "gpu_retire",
    "nic_down": "link_down",
    "disk_ro": "fs",
    "disk_full": "fs",
    "slurmd_kill": "daemon",
    "node_crash": "node_down",
    "rank_stop": "hang_suspect",
}
UNHEALED_S = 3600.0  # a fault only the controller's remedy ends (an XID)
LOCAL_REBOOT_S = 3.5  # the local cluster's fake reboot, when the campaign saw none


def job_nodes_at(jobs: Sequence[JobSample], job_id: int, t: float) -> tuple[str, ...]:
    """The job's nodes in the last sweep at or before ``t`` (none: not yet seen)."""
    seen = [j for j in jobs if j.job_id == job_id and j.t <= t]
    return max(seen, key=lambda j: j.t).nodes if seen else ()


def node_at(nodes: Sequence[NodeSample], name: str, t: float) -> NodeSample | None:
    """``name`` in the last sweep at or before ``t``."""
    seen = [n for n in nodes if n.node == name and n.t <= t]
    return max(seen, key=lambda n: n.t) if seen else None


def sim_faults(
    injections: Sequence[Injection],
    jobs: Sequence[JobSample],
    job_id: int,
    start: float,
    job_size: int,
    spares: int,
    nodes: Sequence[NodeSample] = (),
) -> list[Fault]:
    """The campaign's node faults as the simulator's, in seconds from ``start``: a node
    of the job by its place in the job's sorted node list, a pooled spare on a spare of
    the simulated pool. A node already out of service, or idle outside the job and the
    pool, changes nothing the simulator has: left out."""
    found: list[Fault] = []
    others = 0
    for inj in sorted(injections, key=lambda i: i.t):
        cls = KIND_CLASS.get(inj.kind)
        if cls is None or inj.t < start:
            continue
        members = sorted(job_nodes_at(jobs, job_id, inj.t))
        seen = node_at(nodes, inj.target, inj.t)
        if inj.target in members and members.index(inj.target) < job_size:
            index = members.index(inj.target)
        elif spares and (seen is None or seen.spare):
            index, others = job_size + others % spares, others + 1
        else:
            continue
        duration = HEAL_S.get(inj.kind, UNHEALED_S)
        found.append(Fault(inj.t - start, index, CLASSES[cls], duration, inj.kind))
    return found


def warmups(out: TrainOutput, step_s: float) -> list[float]:
    """Each restart's start as the job saw it: attempt start -> its first step, less one
    step (the simulator counts the first step on its own)."""
    return [
        max(0.0, a.steps[0][1] - a.started_at - step_s) for a in out.attempts[1:] if a.steps
    ] or [max(0.0, a.steps[0][1] - a.started_at - step_s) for a in out.attempts[:1] if a.steps]


def back_in_service(nodes: Sequence[NodeSample]) -> list[float]:
    """Each reboot of ours, from the first sweep with a ``hyperpod:reboot`` reason to
    the first with the node in service (or pooled) again: the fake reboot and the
    re-entry check, as this cluster has them."""
    took: list[float] = []
    series: dict[str, list[NodeSample]] = {}
    for n in sorted(nodes, key=lambda n: n.t):
        series.setdefault(n.node, []).append(n)
    for samples in series.values():
        since: float | None = None
        for n in samples:
            if since is None and n.reason.startswith("hyperpod:reboot"):
                since = n.t
            elif since is not None and (not n.out or n.spare):
                took.append(n.t - since)
                since = None
    return took


def campaign_inputs(
    out: TrainOutput, base: Inputs | None = None, nodes: Sequence[NodeSample] = ()
) -> Inputs:
    """The shipped inputs with the job's own step time and start, and this cluster's
    reboots (the shipped figure is a GPU server's, minutes)."""
    base = base or load_inputs()
    step_s = step_time(out) or base.step_s.median
    starts = warmups(out, step_s) or [0.0]
    here = "measured in this campaign's job output"
    reboots = back_in_service(nodes) or [LOCAL_REBOOT_S]
    return replace(
        base,
        reboot_s=Distribution(
            ((0.0, min(reboots)), (1.0, max(reboots))), tuple(reboots), "this campaign's nodes"
        ),
        step_s=Distribution.fixed(step_s, here),
        job_init_s=Distribution(((0.0, min(starts)), (1.0, max(starts))), tuple(starts), here),
        restore_s=Distribution.fixed(0.0, "in the job's start"),
        restore_memory_s=Distribution.fixed(0.0, "in the job's start"),
        first_step_s=Distribution.fixed(step_s, here),
        checkpoint_block_s=Distribution.fixed(0.0, "the toy's state is a few bytes"),
    )


def predict(
    injections: Sequence[Injection],
    jobs: Sequence[JobSample],
    job_id: int,
    out: TrainOutput,
    job_size: int,
    spares: int,
    ckpt_every: int,
    strategy: Strategy = Strategy.STEP_RETRY,
    nodes: Sequence[NodeSample] = (),
) -> Result | None:
    """The simulator's run of the campaign's job; None when the job printed no steps."""
    steps = [t for a in out.attempts for _, t in a.steps]
    if len(steps) < 2:
        return None
    inputs = campaign_inputs(out, nodes=nodes)
    step_s = inputs.step_s.median
    start, end = min(steps) - step_s, max(steps)
    scenario = Scenario(
        nodes=job_size + spares,
        spares=spares,
        gpus_per_node=1,
        days=(end - start) / 86400.0,
        checkpoint_interval_s=ckpt_every * step_s,
        strategy=strategy,
    )
    faults = sim_faults(injections, jobs, job_id, start, job_size, spares, nodes)
    return simulate(scenario, inputs, faults=faults)


def measured_ettr(out: TrainOutput) -> float | None:
    """The job's distinct steps at its median step time over the same wall time the
    prediction covers (first step's start -> last step)."""
    step_s = step_time(out)
    steps = [t for a in out.attempts for _, t in a.steps]
    if step_s is None or len(steps) < 2:
        return None
    wall = max(steps) - (min(steps) - step_s)
    return len(set(out.steps)) * step_s / wall if wall > 0 else None
