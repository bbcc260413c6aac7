"""SlurmClient against the real local Slurm cluster.

Every test leaves the cluster as it found it: nodes it drains are resumed and jobs it submits
are cancelled, even when an assertion fails.
"""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hyperpod_agent.errors import SlurmError, SlurmTimeout
from hyperpod_agent.localcluster import procs
from hyperpod_agent.slurm.client import SlurmClient, format_reason
from hyperpod_agent.slurm.models import Job
from hyperpod_agent.slurm.version import expansion_refusal, parse_version

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


@pytest.fixture(scope="module")
def client(local_cluster: Any) -> SlurmClient:
    local_cluster.wait_idle(local_cluster.nodes, timeout=30)
    return SlurmClient(slurm_conf=local_cluster.slurm_conf, timeout=15)


@pytest.fixture
def submit(local_cluster: Any, client: SlurmClient) -> Iterator[Callable[..., int]]:
    """``submit(*sbatch_args)`` -> job id; every job is cancelled at the end of the test."""
    submitted: list[int] = []

    def run(*args: str) -> int:
        argv = ["sbatch", "--parsable", "--output=/dev/null", "--chdir=/tmp", *args]
        proc = subprocess.run(
            argv, env=local_cluster.env, capture_output=True, text=True, timeout=15, check=False
        )
        assert proc.returncode == 0, proc.stderr
        job_id = int(proc.stdout.strip().split(";")[0])
        submitted.append(job_id)
        return job_id

    yield run
    for job_id in submitted:
        client.cancel(job_id)
    for job_id in submitted:
        wait_for(partial(_finished, client, job_id), 30, f"job {job_id} to end")
    local_cluster.wait_idle(local_cluster.nodes, timeout=30)


def _finished(client: SlurmClient, job_id: int) -> bool:
    job = client.job(job_id)
    return job is None or job.state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING")


def _in_state(client: SlurmClient, job_id: int, state: str) -> Job | None:
    job = next((j for j in client.list_jobs() if j.job_id == job_id), None)
    return job if job is not None and job.state == state else None


def test_list_nodes_sees_service_nodes_idle_and_spares_drained(
    client: SlurmClient, local_cluster: Any
) -> None:
    nodes = {n.name: n for n in client.list_nodes()}
    assert set(local_cluster.nodes) | set(local_cluster.spares) <= set(nodes)
    for name in local_cluster.nodes:
        node = nodes[name]
        assert (node.state, node.flags) == ("IDLE", frozenset()), node
        assert not node.drained and node.responding
        assert "main" in node.partitions
        assert node.address == "127.0.0.1" and node.port
        assert node.boot_time is not None and node.slurmd_start_time is not None
    for name in local_cluster.spares:
        spare = nodes[name]
        assert spare.drained and "DRAIN" in spare.flags
        assert spare.reason == "hyperpod:spare"
        assert "main" in spare.partitions


def test_ping(client: SlurmClient, local_cluster: Any, tmp_path: Path) -> None:
    assert client.ping() is True
    # The same cluster seen through a slurm.conf that names a port nobody listens on.
    conf = Path(local_cluster.slurm_conf).read_text()
    lines = [
        "SlurmctldPort=1" if line.startswith("SlurmctldPort=") else line
        for line in conf.splitlines()
    ]
    (tmp_path / "slurm.conf").write_text("\n".join(lines) + "\n")
    assert SlurmClient(slurm_conf=tmp_path / "slurm.conf", timeout=15).ping() is False


def test_slurmctld_version_is_the_running_daemons(client: SlurmClient) -> None:
    """Read from slurmctld (``scontrol show config``); the local cluster runs Debian's
    22.05, the release job expansion was shown safe on."""
    version = client.slurmctld_version()
    # The daemon's binary says its own version without reading any slurm.conf.
    command = subprocess.run(
        ["/usr/sbin/slurmctld", "-V"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()[-1]
    assert version is not None and parse_version(version) is not None
    assert version == command  # one Slurm installed here: the daemon's is the command's
    assert expansion_refusal(version) == ""


def test_drain_then_resume_round_trips(client: SlurmClient, local_cluster: Any) -> None:
    name = local_cluster.nodes[-1]
    reason = format_reason("test", "drain round trip", "key=value; a b")
    before = datetime.now(UTC) - timedelta(seconds=2)
    client.drain(name, reason)
    try:
        node = client.node(name)
        assert "DRAIN" in node.flags and node.drained
        assert node.reason == reason
        assert node.reason_user == getpass.getuser()
        assert node.reason_time is not None and node.reason_time >= before.replace(microsecond=0)
        listed = next(n for n in client.list_nodes() if n.name == name)
        assert (listed.reason, listed.flags) == (node.reason, node.flags)
    finally:
        client.resume(name)
    node = client.node(name)
    assert not node.drained and node.reason == ""
    assert node.state == "IDLE"


@pytest.mark.slow
def test_reboot_asap_reboots_and_resumes_the_node(client: SlurmClient, local_cluster: Any) -> None:
    name = local_cluster.nodes[-2]
    pid = local_cluster.slurmd_pid(name)
    reason = format_reason("reboot", "adapter test")
    client.reboot(name, reason)
    try:
        node = client.node(name)
        assert node.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"}, node
        assert node.drained and node.reason.startswith(reason)
        # The reboot restarts slurmd: a new pid proves it (BootTime jitters by a second).
        wait_for(lambda: local_cluster.slurmd_pid(name) not in (None, pid), 30, "a new slurmd")
    finally:
        try:
            wait_for(lambda: _back_in_service(client, name), 90, f"{name} back in service")
        finally:
            if client.node(name).drained:
                client.resume(name)


def _back_in_service(client: SlurmClient, name: str) -> bool:
    node = client.node(name)
    return node.state == "IDLE" and not node.flags


def test_two_node_job_lists_two_distinct_nodes(
    client: SlurmClient, local_cluster: Any, submit: Callable[..., int]
) -> None:
    job_id = submit("-N2", "--job-name=two nodes", "--wrap", "srun sleep 120")
    job = wait_for(lambda: _in_state(client, job_id, "RUNNING"), 30, "the job to run")
    assert len(job.nodes) == 2 and len(set(job.nodes)) == 2
    assert set(job.nodes) <= set(local_cluster.nodes)
    assert job.batch_host in job.nodes
    assert job.name == "two nodes" and job.user == getpass.getuser()
    assert job.start_time is not None and job.end_time is None and job.exit_code is None
    single = client.job(job_id)
    assert single is not None
    assert (single.state, single.nodes, single.batch_host) == ("RUNNING", job.nodes, job.batch_host)


def test_requeue_running_job(client: SlurmClient, submit: Callable[..., int]) -> None:
    job_id = submit("-N1", "--requeue", "--wrap", "sleep 120")
    wait_for(lambda: _in_state(client, job_id, "RUNNING"), 30, "the job to run")
    client.requeue(job_id)
    pending = wait_for(lambda: _in_state(client, job_id, "PENDING"), 15, "the job to be pending")
    assert pending.restart_count == 1
    # Same job id, running again once the credential has expired (cred_expire + 1 s).
    again = wait_for(lambda: _in_state(client, job_id, "RUNNING"), 60, "the job to run again")
    assert again.restart_count == 1


def test_cancel_ends_the_job_and_it_stays_listed(
    client: SlurmClient, submit: Callable[..., int]
) -> None:
    job_id = submit("-N1", "--wrap", "sleep 120")
    wait_for(lambda: _in_state(client, job_id, "RUNNING"), 30, "the job to run")
    client.cancel(job_id)
    job = wait_for(lambda: _in_state(client, job_id, "CANCELLED"), 30, "the job to be cancelled")
    assert job.end_time is not None
    assert job_id not in {j.job_id for j in client.list_jobs(all_states=False)}
    client.cancel(job_id)  # cancelling a finished job is not an error


def test_auto_resume_value_reaches_the_job(
    client: SlurmClient, local_cluster: Any, submit: Callable[..., int]
) -> None:
    help_text = subprocess.run(
        ["sbatch", "--help"], env=local_cluster.env, capture_output=True, text=True, timeout=15
    ).stdout
    assert "--auto-resume" in help_text, "the local cluster did not load the SPANK plugin"
    job_id = submit("-N1", "--auto-resume=2", "--requeue", "--wrap", "sleep 120")
    job = wait_for(lambda: _in_state(client, job_id, "RUNNING"), 30, "the job to run")
    assert job.auto_resume == 2 and job.admin_comment == "auto_resume=2"
    single = client.job(job_id)
    assert single is not None and single.auto_resume == 2


def test_timeout_raises_slurm_timeout(local_cluster: Any) -> None:
    # A frozen slurmctld is the real stall: nothing answers, whatever the machine's speed.
    pid = procs.read_pidfile(local_cluster.dir / "run" / "slurmctld.pid", "slurmctld")
    assert pid is not None, "slurmctld is not running"
    hasty = SlurmClient(slurm_conf=local_cluster.slurm_conf, timeout=0.5)
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(SlurmTimeout, match="timed out after 0.5 s"):
            hasty.list_nodes()
        assert hasty.ping() is False
    finally:
        os.kill(pid, signal.SIGCONT)
    assert SlurmClient(slurm_conf=local_cluster.slurm_conf).ping() is True


def test_unknown_node_raises_naming_the_node(client: SlurmClient) -> None:
    with pytest.raises(SlurmError, match="nosuchnode7"):
        client.node("nosuchnode7")
    with pytest.raises(SlurmError, match="nosuchnode7"):
        client.drain("nosuchnode7", "hyperpod:test")


def test_unknown_job(client: SlurmClient) -> None:
    assert client.job(9_999_999) is None
    with pytest.raises(SlurmError, match="9999999"):
        client.requeue(9_999_999)
    with pytest.raises(SlurmError, match="cannot cancel job 9999999"):
        client.cancel(9_999_999)


def test_a_running_job_is_shrunk_and_a_spare_merged_into_it(
    local_cluster: Any, client: SlurmClient, submit: Callable[..., int]
) -> None:
    """The in-allocation retry recipe: same job id, never out of RUNNING, no restart."""
    spare = local_cluster.spares[0]
    job_id = submit("-N2", "-w", "node1,node2", "--wrap", "sleep 120")
    wait_for(partial(_in_state, client, job_id, "RUNNING"), 30, f"job {job_id} running")
    helper: int | None = None
    try:
        client.shrink_job(job_id, ["node1"])
        job = client.job(job_id)
        assert job is not None and (job.state, job.nodes) == ("RUNNING", ("node1",))
        client.resume(spare)
        helper = client.allocate_expansion(job_id, spare, 10)
        client.absorb_expansion(job_id, helper)
        job = client.job(job_id)
        assert job is not None
        assert (job.state, job.nodes, job.restart_count) == ("RUNNING", ("node1", spare), 0)
        step = subprocess.run(
            ["srun", f"--jobid={job_id}", "-N2", "hostname"],
            env=local_cluster.env, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert step.returncode == 0, step.stderr
        assert sorted(step.stdout.split()) == ["node1", spare]
        # a node that is not free is refused within the wait, its helper gone
        client.drain("node2", format_reason("test", "busy"))
        with pytest.raises(SlurmError, match="no expansion on node2"):
            client.allocate_expansion(job_id, "node2", 2)
        pending = [j for j in client.list_jobs(all_states=False) if j.name.startswith("hyperpod-")]
        assert pending == []
    finally:
        client.cancel(job_id)
        if helper is not None:
            client.cancel(helper)
        wait_for(partial(_finished, client, job_id), 30, f"job {job_id} to end")
        client.resume("node2")
        client.drain(spare, "hyperpod:spare")
