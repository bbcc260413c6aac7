"""``hyperpod demo``: the README's first command, on a local cluster.

Brings the local cluster up, submits an ``--auto-resume=1`` job across two nodes,
shows what the job and the Slurm adapter see, and brings the cluster down again
(``--keep`` leaves it running for exploring).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import click

from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.slurm.client import SlurmClient

DEMO_DIR = Path("/var/tmp/hyperpod-demo")
DEMO_PORT_BASE = 16917
JOB = "srun bash -c 'echo \"$(hostname): HYPERPOD_AUTO_RESUME=$HYPERPOD_AUTO_RESUME\"'"


def _say(text: str) -> None:
    click.secho(f"==> {text}", bold=True)


@click.command("demo")
@click.option("--dir", "dir_", type=click.Path(path_type=Path), default=DEMO_DIR, show_default=True)
@click.option("--port-base", type=int, default=DEMO_PORT_BASE, show_default=True)
@click.option("--keep", is_flag=True, help="Leave the cluster running at the end.")
def demo(dir_: Path, port_base: int, keep: bool) -> None:
    """Local cluster + an --auto-resume=1 job across two nodes."""
    cluster = LocalCluster(dir_, nodes=4, spares=1, port_base=port_base)
    _say(f"starting a local Slurm cluster in {cluster.dir}: 4 nodes + 1 spare")
    t0 = time.monotonic()
    cluster.up(timeout=60)
    try:
        slurm = SlurmClient(slurm_conf=cluster.slurm_conf)
        for node in slurm.list_nodes():
            click.echo(
                f"    {node.name:<6} {node.state:<9} {'+'.join(sorted(node.flags)):<6} "
                f"{node.reason}"
            )
        click.echo(f"    up in {time.monotonic() - t0:.1f} s")
        out = cluster.dir / "out" / "demo-%j.out"
        _say("sbatch --auto-resume=1 -N2 (a job across two nodes)")
        res = subprocess.run(
            ["sbatch", "--parsable", "--auto-resume=1", "-N2", "-o", str(out), "--wrap", JOB],
            capture_output=True,
            text=True,
            env=cluster.env,
            timeout=30,
        )
        if res.returncode != 0:
            raise HyperpodError(f"sbatch failed: {res.stderr.strip()}")
        job_id = int(res.stdout.strip().split(";")[0])
        job = slurm.job(job_id)
        deadline = time.monotonic() + 60
        while job is not None and job.state in ("PENDING", "RUNNING", "COMPLETING"):
            if time.monotonic() > deadline:
                raise HyperpodError(f"job {job_id} did not finish within 60 s")
            time.sleep(0.3)
            job = slurm.job(job_id)
        if job is None:
            raise HyperpodError(f"job {job_id} vanished from squeue")
        _say(f"what the job's tasks saw (job {job_id})")
        for line in Path(str(out).replace("%j", str(job_id))).read_text().splitlines():
            click.echo(f"    {line}")
        _say("what the Slurm adapter sees")
        click.echo(
            f"    job {job.job_id}: state={job.state} nodes={','.join(job.nodes)} "
            f"auto_resume={job.auto_resume} admin_comment={job.admin_comment!r}"
        )
    finally:
        if keep:
            _say(
                f"cluster left running: export SLURM_CONF={cluster.slurm_conf}; "
                f"stop it with: hyperpod local-cluster down --dir {cluster.dir}"
            )
        else:
            _say("stopping the local cluster")
            cluster.down()
