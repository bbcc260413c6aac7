"""``hyperpod demo``: the README's first command, the whole story on a local cluster.

A local Slurm cluster (4 nodes + 1 spare) comes up with the controller and an agent
per node (fake GPUs). A PyTorch DDP training job (examples/train_ddp.sbatch: gloo on
CPU, one rank per node, a checkpoint in memory with a peer replica every step) runs
its step under ``srun --auto-resume=1``; once it has checkpointed, XID 79 ("GPU has
fallen off the bus") is injected on one of its nodes, chosen at random. The agent
reports it, the controller ends the step, takes the node out, merges the spare into
the same job, and the step runs again there: same job id, never back in the queue,
the new rank restored from its peer's replica. The demo prints the timeline, the
steps lost and the job's measured goodput, then stops the cluster (``--keep`` leaves
it up). Without torch (setup.sh installs it where it can) the toy job
(examples/train_in_place.sbatch) stands in.
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import click

from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.localcluster import drill
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient

DEMO_DIR = Path("/var/tmp/hyperpod-demo")
DEMO_PORT_BASE = 16917
DDP_PORT = 29690  # the job's rendezvous; + 1 and on: its nodes' replica servers
# steps, extra compute per step (s), persistent checkpoint every, steps before the fault
DDP_RUN = (60, 0.25, 10, 12)
TOY_RUN = (30, 0.5, 5, 8)


def _job(cluster: LocalCluster) -> tuple[str, str, dict[str, str], tuple[int, float, int, int]]:
    """(what, script, env, run) of the demo's job: train_ddp when torch is installed
    (found, not imported: the job's python3 is this one, the demo needs none of it)."""
    if importlib.util.find_spec("torch") is None:
        what = "a toy job (torch is not installed)"
        return what, "train_in_place.sbatch", {}, TOY_RUN
    scratch = cluster.dir / "ddp" / f"demo-{time.time_ns()}"
    scratch.mkdir(parents=True, mode=0o755)
    env = drill.ddp_env(scratch, DDP_PORT, "--eval-every 20 --threads 1")
    return "a PyTorch DDP job (gloo, CPU)", "train_ddp.sbatch", env, DDP_RUN


def _say(text: str) -> None:
    click.secho(f"==> {text}", bold=True)


def _admin(cluster: LocalCluster, *args: str) -> None:
    """Run the real admin CLI against the demo's controller, indented."""
    env = {**os.environ, "HYPERPOD_LOCAL_CLUSTER_DIR": str(cluster.dir)}
    res = subprocess.run(
        [sys.executable, "-m", "hyperpod_agent", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    for line in (res.stdout or res.stderr).rstrip().splitlines():
        click.echo(f"    {line[:150]}")


def _nodes(slurm: SlurmClient) -> None:
    for node in slurm.list_nodes():
        flags = "+".join(sorted(node.flags))
        click.echo(f"    {node.name:<6} {node.state:<9} {flags:<22} {node.reason[:70]}")


def _spares_qualified(cluster: LocalCluster) -> bool:
    """Every pooled spare passed a deep check, and no check run is under way."""
    from hyperpod_agent.admin.common import make_client

    client = make_client(None, None, cluster.dir / "etc" / "admin.toml", 10)
    runs = client.checks()
    if not isinstance(runs, list) or any(r.get("phase") != "done" for r in runs):
        return False
    for name in cluster.spares:
        outcomes = client.node(name).get("deep_checks", [])
        if not any(o.get("outcome") == "OK" for o in outcomes):
            return False
    return True


def _wait_for_spares(cluster: LocalCluster) -> None:
    """With a deep-check suite named the spare gate is on, as shipped: a spare stands in
    only once it passed its check, which the controller starts as soon as it sees the
    spare. Wait for it, so the fault meets a ready pool (else: a requeue)."""
    from hyperpod_agent.controller.config import load_config

    if not load_config(cluster.dir / "etc" / "controller.toml").deep_checks.spare_gate_on:
        return
    t0 = time.monotonic()
    drill.wait_for("the spare's deep check", 120, lambda: _spares_qualified(cluster), 0.5)
    click.echo(
        f"    spare {','.join(cluster.spares)} passed its deep check "
        f"({time.monotonic() - t0:.1f} s): ready to stand in"
    )


def story(cluster: LocalCluster) -> None:
    slurm = SlurmClient(slurm_conf=cluster.slurm_conf)
    _nodes(slurm)
    _wait_for_spares(cluster)
    what, script, env, (steps, step_time, ckpt_every, warm) = _job(cluster)
    _say(
        f"sbatch examples/{script}: {what}, {steps} steps on 2 nodes under "
        f"srun --auto-resume=1, a persistent checkpoint every {ckpt_every}"
        + (", in memory with a peer replica every step" if env else "")
    )
    job_id, out = drill.submit_training(
        cluster, steps, step_time, ckpt_every, auto_resume=None, script=script, env=env
    )
    drill.wait_for(
        f"job {job_id} to reach step {warm}",
        180,  # torch's import on a busy 2-core machine takes a while
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= warm,
    )
    job = slurm.job(job_id)
    if job is None:
        raise HyperpodError(f"job {job_id} vanished")
    click.echo(
        f"    job {job_id} running on {','.join(job.nodes)}; its srun was handed over to "
        "hyperpod step-retry, which keeps the step watched by the controller"
    )
    # Where a real fault lands: any node of the job, its batch host included (Slurm
    # keeps that one in the job; the step runs again without it).
    victim = random.SystemRandom().choice(sorted(job.nodes))
    role = " (the job's batch host)" if victim == job.batch_host else ""
    _say(f"injecting XID 79 (GPU has fallen off the bus) on gpu3 of {victim}{role}")
    fault_at = drill.inject_xid(cluster, victim)
    timeline = drill.follow_step_retry(cluster, job_id, victim, fault_at, out)
    done = drill.wait_job_end(cluster, job_id)
    log = drill.parse_train_log(out.read_text())
    _say("timeline (seconds after the fault)")
    for what, offset in timeline.offsets().items():
        if offset is not None:  # a step retried in place is never requeued
            click.echo(f"    {what.replace('_', ' '):<16} +{offset:.2f} s")
    first = log.attempts[0]
    last_before = max((s for s, _ in first.steps), default=0)
    resumed = log.attempts[-1].resumed_from or 0
    click.echo(
        f"    job {job_id} {done.state} after {done.restart_count} requeue(s) and "
        f"{len(log.attempts) - 1} step retry(ies) in place; the step ran again on "
        f"{','.join(timeline.new_nodes)} (not on {victim})"
    )
    bound = "at most one" if env else f"at most one checkpoint interval, {ckpt_every}"
    click.echo(
        f"    last step before the fault: {last_before}; resumed from checkpoint "
        f"step {resumed}; lost {last_before - resumed} step(s) ({bound}); "
        f"finished step {log.done_step}"
    )
    _say("nodes now")
    _nodes(slurm)
    _say(f"the step's output: {out}")
    for line in out.read_text().splitlines():
        if not line.startswith(("step=", "eval ")):
            click.echo(f"    {line[:150]}")
    _say(f"hyperpod events --job {job_id}")
    _admin(cluster, "events", "--job", str(job_id), "--limit", "12")
    _say("hyperpod jobs")
    _admin(cluster, "jobs")
    _say(f"hyperpod goodput --job {job_id}")
    _admin(cluster, "goodput", "--job", str(job_id))


@click.command("demo")
@click.option("--dir", "dir_", type=click.Path(path_type=Path), default=DEMO_DIR, show_default=True)
@click.option("--port-base", type=int, default=DEMO_PORT_BASE, show_default=True)
@click.option("--keep", is_flag=True, help="Leave the cluster running at the end.")
def demo(dir_: Path, port_base: int, keep: bool) -> None:
    """Local cluster + agents + controller; an srun --auto-resume step survives a GPU
    fault inside its job."""
    cluster = LocalCluster(dir_, nodes=4, spares=1, port_base=port_base)
    _say(
        f"starting a local Slurm cluster in {cluster.dir}: 4 nodes + 1 spare, "
        "a controller and an agent per node (fake GPUs)"
    )
    t0 = time.monotonic()
    cluster.up(timeout=60, services=True)
    try:
        click.echo(
            f"    up in {time.monotonic() - t0:.1f} s; controller at "
            f"{cluster.services.controller_url}"
        )
        story(cluster)
    finally:
        if keep:
            _say(
                f"cluster left running: export SLURM_CONF={cluster.slurm_conf} "
                f"HYPERPOD_LOCAL_CLUSTER_DIR={cluster.dir}; stop it with: "
                f"hyperpod local-cluster down --dir {cluster.dir}"
            )
        else:
            _say("stopping the local cluster")
            cluster.down()
