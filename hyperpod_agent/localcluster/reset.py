"""Back to a known state between fault drills: no jobs left to resurrect, healthy
hardware and agents, the spares drained again, or a controller started afresh with
other settings. Used by the integration tests' fixtures and the benchmarks."""

from __future__ import annotations

import subprocess
from functools import partial
from pathlib import Path
from typing import Any

from hyperpod_agent.errors import SlurmError
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.localcluster.drill import healthy_gpus, wait_for
from hyperpod_agent.localcluster.render import SPARE_REASON
from hyperpod_agent.localcluster.services import to_toml
from hyperpod_agent.slurm.client import SlurmClient
from hyperpod_agent.slurm.models import Job


def reset_cluster(cluster: LocalCluster, timeout: float = 90.0) -> None:
    """Back to the start of a drill: no jobs, healthy hardware and agents, nodes
    1..N in service and the spares drained as ``hyperpod:spare``. The controller's
    deep-check jobs are left to their runs: cancelled, they would hold their nodes."""
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    for job in slurm.list_jobs(all_states=False):
        if not check_job(job):
            slurm.cancel(job.job_id)
    retire_finished_jobs(cluster)
    services = cluster.services
    for node in cluster.shape.all_names:
        cluster.node_start(node)  # a crashed node comes back (no-op when running)
        healthy_gpus(cluster, node)
        services.make_node_hardware(node)
        services.set_link(node, True)
        subprocess.run(
            ["mount", "-o", "remount,rw", str(services.scratch(node))],
            capture_output=True,
            timeout=10,
        )
        services.stop(f"agent-{node}")
        services.start_agent(node)
    wait_for(
        "reboots to finish",
        timeout,
        lambda: not any(any(f.startswith("REBOOT") for f in n.flags) for n in slurm.list_nodes()),
        interval=0.3,
    )
    checking = under_check(slurm)
    for n in slurm.list_nodes():
        if n.name in cluster.spares:
            # a spare the controller is qualifying is back in the pool when its run ends
            if n.reason != SPARE_REASON and n.name not in checking:
                slurm.drain(n.name, SPARE_REASON)
        elif n.drained and (n.reason.startswith("hyperpod:") or n.state == "DOWN"):
            slurm.resume(n.name)
    cluster.wait_idle(cluster.nodes, timeout=timeout)


CHECK_RESERVATION = "hyperpod-check-"


def check_job(job: Job) -> bool:
    """A deep-check run's job (named after its reservation)."""
    return job.name.startswith(CHECK_RESERVATION)


def under_check(slurm: SlurmClient) -> set[str]:
    """Nodes in a deep-check run's reservation: resumed inside it for the run, they are
    the controller's until the run puts them back."""
    ours = [r for r in slurm.reservations() if r.name.startswith(CHECK_RESERVATION)]
    return {n for r in ours for n in r.nodes}


def forget_check_runs(cluster: LocalCluster, timeout: float = 30.0) -> list[str]:
    """Undo the deep-check runs a stopped controller left under way, before a controller
    starts on empty state: it would find their reservations without a run and hold the
    nodes in them (its orphan sweep: their state before the run is unknown). With a
    suite the gates are on, so a controller qualifies the spares as soon as it starts.
    Cancels the runs' jobs, deletes the reservations and drains a spare a run had
    resumed back into the pool; returns the reservations deleted."""
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    ours = [r for r in slurm.reservations() if r.name.startswith(CHECK_RESERVATION)]
    names = {r.name for r in ours}
    for job in slurm.list_jobs(all_states=False):
        if job.name in names:
            slurm.cancel(job.job_id)

    def deleted(name: str) -> bool:
        try:
            slurm.delete_reservation(name)
        except SlurmError:  # a cancelled job still leaving it
            return False
        return True

    for name in sorted(names):
        wait_for(f"reservation {name} deleted", timeout, partial(deleted, name), interval=0.5)
    checked = {n for r in ours for n in r.nodes}
    for n in slurm.list_nodes():
        if n.name in checked and n.name in cluster.spares and not n.drained:
            slurm.drain(n.name, SPARE_REASON)
    return sorted(names)


def fresh_controller(
    cluster: LocalCluster,
    policy: dict[str, Any] | None = None,
    deep_checks: dict[str, Any] | None = None,
    provider: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Restart the controller on empty state with ``policy`` and ``deep_checks``
    overrides (and a ``[provider]`` section, variables added to its environment), and
    every agent with it (each sends a full report to the new one)."""
    services = cluster.services
    for node in cluster.shape.all_names:
        services.stop(f"agent-{node}")
    services.stop("controller")
    forget_check_runs(cluster)
    config = services.controller_config()
    config["policy"].update(policy or {})
    config["deep_checks"].update(deep_checks or {})
    if provider is not None:
        config["provider"] = dict(provider)
    services.controller_config_path().write_text(to_toml(config))
    db = Path(config["state_db"])
    for path in db.parent.glob(db.name + "*"):
        path.unlink()
    services.start_controller(env=env)
    for node in cluster.shape.all_names:
        services.start_agent(node)


def retire_finished_jobs(cluster: LocalCluster) -> list[int]:
    """Turn every FAILED / NODE_FAIL job that opted into auto-resume into CANCELLED.

    Slurm shows a finished job for MinJobAge, and a fault found on its node within
    ``fault_window_s`` of its end rightly has it requeued: a drill's fault must not
    resurrect a job an earlier test left behind. ``scontrol requeuehold`` then
    ``scancel`` ends it as CANCELLED, which auto-resume never requeues. Returns the ids.
    """
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
    retired = []
    for job in slurm.list_jobs():
        if job.auto_resume is None or job.state not in ("FAILED", "NODE_FAIL"):
            continue
        held = subprocess.run(
            ["scontrol", "requeuehold", str(job.job_id)],
            env=cluster.env, capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        if held.returncode == 0:  # a --no-requeue job cannot be requeued by anyone
            slurm.cancel(job.job_id)
            retired.append(job.job_id)
    return retired
