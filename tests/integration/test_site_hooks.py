"""A site that already has its own Slurm hooks, provisioned by hyperpod: the site's
HealthCheckProgram, Prolog, EpilogSlurmctld and job_submit.lua keep running beside
hyperpod's; step retry, the job-level requeue, a hang and a deep check work on it;
and hyperpod's Prolog gate keeps a new job off a node with an urgent fault.

The local cluster with ``site_hooks`` writes the site's slurm.conf with those hooks;
each node's lifecycle script (lifecycle_scripts/on_create.sh, run by
localcluster/provisioned.py) merges hyperpod in, as on a new instance. One cluster
for the module.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from drill_helpers import Dice, Drill, wait_for

from hyperpod_agent.localcluster import drill, reset
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.localcluster.render import SITE_COMMENT
from hyperpod_agent.slurm.client import SlurmClient

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

SITE_DIR = Path("/var/tmp/hyperpod-site-hooks")
SITE_PORT_BASE = 19417


@pytest.fixture(scope="module")
def site_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster(SITE_DIR, nodes=3, spares=1, port_base=SITE_PORT_BASE, site_hooks=True)
    try:
        cluster.up(timeout=60, services=True)
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def cluster(site_cluster: LocalCluster) -> Iterator[LocalCluster]:
    reset.reset_cluster(site_cluster)
    d = Drill(site_cluster)
    if d.spare_gate_on():
        wait_for("the spares qualified", d.spares_qualified, timeout=120.0, step=1.0)
    yield site_cluster
    (site_cluster.dir / "etc" / "hyperpod" / "agent.toml").unlink(missing_ok=True)
    reset.reset_cluster(site_cluster)


def site_log(cluster: LocalCluster, hook: str) -> str:
    path = cluster.dir / "log" / f"site-{hook}.log"
    return path.read_text() if path.exists() else ""


def job_comment(cluster: LocalCluster, job_id: int) -> str | None:
    """The job's Comment as ``scontrol show job`` prints it."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", str(job_id)],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    found = re.search(r"(?:^|\s)Comment=(\S+)", out)
    return found.group(1) if found else None


def sbatch(cluster: LocalCluster, *args: str) -> int:
    out = subprocess.run(
        ["sbatch", "--parsable", "-o", "/dev/null", *args],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    return int(out.strip().split(";")[0])


def test_the_site_hooks_run_beside_hyperpods(cluster: LocalCluster) -> None:
    settings = subprocess.run(
        ["scontrol", "show", "config"], env=cluster.env, capture_output=True, text=True,
        timeout=10, check=True,
    ).stdout  # fmt: skip
    assert "permit_job_expansion" in settings  # merged into the site's own list
    assert "sched_interval=2" in settings
    job_id = sbatch(cluster, "--auto-resume=1", "-N1", "--wrap", "srun true")
    done = drill.wait_job_end(cluster, job_id, timeout=60)
    assert done.state == "COMPLETED"
    # The site's job_submit.lua still tags the job; ours still records --auto-resume.
    assert job_comment(cluster, job_id) == SITE_COMMENT
    assert done.auto_resume == 1, done
    wait_for(
        "the site's EpilogSlurmctld ran for the job",
        lambda: f"job={job_id} " in site_log(cluster, "epilog_ctld"),
        timeout=30,
    )
    assert f"job={job_id} " in site_log(cluster, "prolog")
    assert site_log(cluster, "nhc")  # slurmd runs it at start and every 5 s
    # hyperpod's epilog ran too, and told the controller (as root, an admin here).
    job_end = cluster.dir / "var" / "log" / "hyperpod" / "job_end.log"
    wait_for(
        "hyperpod's epilog logged the job",
        lambda: job_end.exists() and f"job={job_id} " in job_end.read_text(),
        timeout=30,
    )
    assert "couldn't notify" not in job_end.read_text()


def test_step_retry_on_the_provisioned_site(cluster: LocalCluster) -> None:
    job_id, out = drill.submit_training(
        cluster, steps=24, step_time=0.3, ckpt_every=5, auto_resume=None,
        script="train_in_place.sbatch",
    )  # fmt: skip
    drill.wait_for(
        f"job {job_id} to reach step 4",
        90,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= 4,
    )
    job = drill.job_of(cluster, job_id)
    victim = Dice("site step retry").node("victim", job.nodes)  # the batch host included
    drill.inject_xid(cluster, victim)
    done = drill.wait_job_end(cluster, job_id, timeout=180)
    text = out.read_text()
    assert done.state == "COMPLETED", text[-2000:]
    assert done.restart_count == 0
    log = drill.parse_train_log(text)
    assert len(log.attempts) == 2, text[-2000:]
    assert victim not in log.attempts[1].nodes
    assert log.done_step == 24


def test_the_prolog_gate_keeps_a_job_off_a_node_with_an_urgent_fault(
    cluster: LocalCluster,
) -> None:
    """The site's nodes here share one file system, so the gate's agent.toml (which
    names no node: the Prolog's SLURMD_NODENAME says which) is written for the drill and
    points at a health cache that says "urgent fault"."""
    d = Drill(cluster)
    target = Dice("prolog gate").node("faulty node", cluster.nodes)
    cache = cluster.dir / "run" / "prolog-gate-health.json"
    cache.write_text(
        json.dumps(
            {
                "node": target,
                "verdict": "faulty",
                "urgent": True,
                "action": "REBOOT",
                "message": "gpu0 xid79 drill",
                "generated_at": datetime.now(UTC).isoformat(),
            }
        )
    )
    agent = cluster.dir / "etc" / "hyperpod" / "agent.toml"
    agent.write_text(
        f'cache_path = "{cache}"\nslurm_conf = "{cluster.slurm_conf}"\n'
        "[health_check]\nstale_after_s = 600\n"
        '[controller]\nurl = "http://127.0.0.1:1"\nslurm_user = "root"\n'
    )
    try:
        job_id = sbatch(cluster, "--auto-resume=1", "-N1", "-w", target, "--wrap", "srun true")
        slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
        wait_for(
            f"{target} drained by the gate",
            lambda: slurm.node(target).reason.startswith("hyperpod:drain prolog urgent"),
            timeout=60,
        )
        # Requeued and not held (nohold_on_prolog_fail): it waits for its node.
        wait_for(
            f"job {job_id} requeued",
            lambda: drill.job_of(cluster, job_id).state == "PENDING",
            timeout=30,
        )
        job = drill.job_of(cluster, job_id)
        assert "held" not in job.state_reason.lower(), job
    finally:
        agent.unlink(missing_ok=True)
    # The reason is ours: with the node's own agent healthy, the controller returns it
    # and the job runs there.
    done = drill.wait_job_end(cluster, job_id, timeout=120)
    assert done.state == "COMPLETED"
    assert any(e.get("node") == target for e in d.events())


def reached(cluster: LocalCluster, job_id: int, out: Path, steps: int) -> list[str]:
    drill.wait_for(
        f"job {job_id} to reach step {steps}",
        90,
        lambda: out.exists() and drill.parse_train_log(out.read_text()).last_step >= steps,
    )
    return list(drill.job_of(cluster, job_id).nodes)


def test_a_job_requeues_on_the_provisioned_site(cluster: LocalCluster) -> None:
    """sbatch --auto-resume=1: a fault on any node of the job (the batch host too)."""
    job_id, out = drill.submit_training(cluster, steps=24, step_time=0.3, ckpt_every=5)
    nodes = reached(cluster, job_id, out, 6)
    victim = Dice("site requeue").node("victim", nodes)
    drill.inject_xid(cluster, victim)
    done = drill.wait_job_end(cluster, job_id, timeout=180)
    text = out.read_text()
    assert done.state == "COMPLETED" and done.restart_count == 1, text[-2000:]
    log = drill.parse_train_log(text)
    assert log.done_step == 24 and log.attempts[-1].resumed_from is not None
    assert victim not in log.attempts[-1].nodes.replace("[", ",").split(",")


def test_a_deep_check_runs_on_the_provisioned_site(cluster: LocalCluster) -> None:
    d = Drill(cluster)
    node = Dice("site deep check").node("checked node", cluster.nodes)
    res = subprocess.run(
        [sys.executable, "-m", "hyperpod_agent", "node", "check", node, "--wait"],
        env=d.env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, (res.stdout, res.stderr)
    for check in ("dcgm-quick", "nvlink"):
        assert any(line.split()[:3] == [node, check, "OK"] for line in res.stdout.splitlines())
    assert not [r for r in d.slurm.reservations() if r.name.startswith("hyperpod-check-")]


def test_a_hang_is_declared_and_recovered_on_the_provisioned_site(cluster: LocalCluster) -> None:
    """A rank frozen (SIGSTOP) on a node drawn at random, the batch host included."""
    d = Drill(cluster)
    sync = cluster.dir / "out" / f"sync-{datetime.now(UTC).timestamp():.6f}"
    sync.mkdir(parents=True)
    job_id, out = drill.submit_training(
        cluster, steps=60, step_time=0.3, ckpt_every=5, train_args=("--sync", str(sync))
    )
    try:
        nodes = reached(cluster, job_id, out, 15)
        victim = Dice("site hang").node("frozen node", nodes)
        drill.freeze_ranks(cluster, job_id, victim)

        def hangs() -> list[dict[str, Any]]:
            return [e for e in d.events() if e["kind"] == "hang" and e.get("job_id") == job_id]

        wait_for(
            "the hang declared",
            lambda: bool(hangs()),
            timeout=60.0,
            step=0.5,
            detail=lambda: drill.rank_records(cluster, job_id),
        )
        [hang] = hangs()
        assert f"suspect {victim} ({victim}: rank" in hang["message"], hang
        done = drill.wait_job_end(cluster, job_id, timeout=180)
        log = drill.parse_train_log(out.read_text())
        assert done.state == "COMPLETED" and done.restart_count == 1, out.read_text()[-2000:]
        assert log.done_step == 60 and log.attempts[-1].resumed_from is not None
    finally:
        subprocess.run(["scancel", str(job_id)], env=cluster.env, capture_output=True, timeout=30)
