"""On the real local cluster: the agent's janitor asks slurmctld about each idle memory
tier and frees only those of finished or forgotten jobs."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.agent.janitor import MemoryTierConfig, MemoryTierJanitor, slurm_lookup
from hyperpod_agent.localcluster.drill import wait_for, wait_job_end
from hyperpod_agent.slurm.client import SlurmClient

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]


def sbatch(cluster: Any, *args: str) -> int:
    proc = subprocess.run(
        ["sbatch", "--parsable", "--output=/dev/null", "--chdir=/tmp", *args],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def _state(client: SlurmClient, job_id: int) -> str | None:
    job = client.job(job_id)
    return job.state if job is not None else None


def idle_tier(root: Path, job_id: int) -> Path:
    d = root / str(job_id) / "step-0000000005"
    d.mkdir(parents=True)
    (d / "rank-00000.bin").write_bytes(b"\0" * 4096)
    then = time.time() - 7200
    os.utime(d, (then, then))
    os.utime(d.parent, (then, then))
    return d.parent


def test_janitor_frees_finished_and_forgotten_jobs_only(local_cluster: Any, tmp_path: Path) -> None:
    local_cluster.wait_idle(local_cluster.nodes, timeout=30)
    client = SlurmClient(slurm_conf=local_cluster.slurm_conf, timeout=15)
    done = sbatch(local_cluster, "--wrap", "true")
    running = sbatch(local_cluster, "--wrap", "sleep 120")
    try:
        assert wait_job_end(local_cluster, done, timeout=60).state == "COMPLETED"
        wait_for(f"job {running} to run", 60, lambda: _state(client, running) == "RUNNING")
        tiers = {
            "finished": idle_tier(tmp_path, done),
            "running": idle_tier(tmp_path, running),
            "forgotten": idle_tier(tmp_path, 999_999),
        }
        janitor = MemoryTierJanitor(
            MemoryTierConfig(root=tmp_path), slurm_lookup(str(local_cluster.slurm_conf))
        )
        assert sorted(janitor.sweep()) == sorted([done, 999_999])
        assert not tiers["finished"].exists() and not tiers["forgotten"].exists()
        assert tiers["running"].exists()

        # slurmctld unreachable (a wrong slurm.conf): nothing is removed
        unreachable = MemoryTierJanitor(
            MemoryTierConfig(root=tmp_path), slurm_lookup(str(tmp_path / "no-slurm.conf"), 5)
        )
        idle_tier(tmp_path, done)
        assert unreachable.sweep() == []
        assert (tmp_path / str(done)).exists() and tiers["running"].exists()
    finally:
        client.cancel(running)
        wait_job_end(local_cluster, running, timeout=30)
    local_cluster.wait_idle(local_cluster.nodes, timeout=30)
