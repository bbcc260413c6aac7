"""The local cluster itself: shape, jobs across nodes, a clean down, bad input."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hyperpod_agent.localcluster import drill, leftovers, procs
from hyperpod_agent.localcluster.cluster import LocalCluster

pytestmark = pytest.mark.slurm

HYPERPOD = [sys.executable, "-m", "hyperpod_agent"]


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def test_nodes_idle_and_spare_held_out(local_cluster: LocalCluster) -> None:
    states = local_cluster.node_states()
    for name in local_cluster.nodes:
        assert states[name] == "IDLE", states
    for name in local_cluster.spares:
        assert "DRAIN" in states[name], states


def test_two_node_batch_job_runs_on_two_distinct_nodes(local_cluster: LocalCluster) -> None:
    out = local_cluster.dir / "out" / "two-node-%j.out"
    res = run(
        ["sbatch", "--parsable", "--wait", "-N2", "-o", str(out), "--wrap", "srun hostname"],
        env=local_cluster.env,
    )
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    hosts = Path(str(out).replace("%j", job)).read_text().split()
    assert len(hosts) == 2 and len(set(hosts)) == 2
    assert set(hosts) <= set(local_cluster.nodes)


def test_up_twice_is_safe(local_cluster: LocalCluster) -> None:
    shape = local_cluster.shape
    res = run(
        [
            *HYPERPOD,
            "local-cluster",
            "up",
            "--dir",
            str(local_cluster.dir),
            "--nodes",
            str(shape.nodes),
            "--spares",
            str(shape.spares),
            "--port-base",
            str(shape.port_base),
        ]
    )
    assert res.returncode == 0, res.stderr
    assert "already running" in res.stderr
    assert res.stdout.strip() == f"export SLURM_CONF={local_cluster.slurm_conf}"


def test_up_with_another_shape_on_a_running_cluster_is_refused(
    local_cluster: LocalCluster,
) -> None:
    res = run(
        [
            *HYPERPOD,
            "local-cluster",
            "up",
            "--dir",
            str(local_cluster.dir),
            "--nodes",
            "2",
            "--port-base",
            str(local_cluster.shape.port_base),
        ]
    )
    assert res.returncode != 0
    assert "different local cluster" in res.stderr
    assert local_cluster.running()


def _leftovers(cluster: LocalCluster) -> list[int]:
    return list(cluster.owned_pids().values()) + cluster.namespace_pids()


def test_down_leaves_no_process_behind(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", nodes=2, spares=1, port_base=19817)
    try:
        cluster.up(timeout=60)
        pids = list(cluster.owned_pids().values())
        assert len(pids) == 5  # munged, slurmctld, 3 slurmd
        # a running job leaves slurmstepd and a task in the nodes' namespaces
        subprocess.run(
            ["sbatch", "-N2", "--wrap", "srun sleep 300"],
            env=cluster.env,
            check=True,
            capture_output=True,
            timeout=30,
        )
        deadline = time.monotonic() + 30
        while len(cluster.namespace_pids()) <= 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        job_pids = cluster.namespace_pids()
        assert len(job_pids) > 3
    finally:
        left = cluster.down()
    for pid in pids + job_pids:
        assert not procs.alive(pid), f"pid {pid} still alive after down"
    assert _leftovers(cluster) == [] and left == []


def test_down_racing_a_reboot_leaves_nothing_behind(tmp_path: Path) -> None:
    """slurmctld's RebootProgram runs the fake reboot in the background: a ``down``
    that lands while it runs waits for it, stops the slurmd it started, and leaves no
    process, mount or namespace; a reboot asked for after ``down`` starts nothing."""
    cluster = LocalCluster(tmp_path / "c", nodes=1, spares=0, port_base=21017)
    argv = [*HYPERPOD, "local-cluster", "node-reboot", "--dir", str(cluster.dir), "node1"]
    reboot = None
    try:
        cluster.up(timeout=60)
        old = cluster.slurmd_pid("node1")
        reboot = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
        # between stopping the old slurmd and starting the new one (a 2 s pause)
        drill.wait_for("the reboot to stop slurmd", 20, lambda: cluster.slurmd_pid("node1") is None)
    finally:
        left = cluster.down()
    assert reboot is not None
    _, err = reboot.communicate(timeout=60)
    assert "rebooted" in err and old is not None and not procs.alive(old), err
    assert left == []
    res = run([*argv])
    assert res.returncode != 0 and "being stopped" in res.stderr, res.stderr
    assert leftovers.leftovers(cluster.dir, "hp21017-") == []


def test_a_spare_put_into_service_stays_there_across_a_slurmctld_restart(
    tmp_path: Path,
) -> None:
    """Spares start drained as hyperpod:spare; one the controller resumed stays in
    service when slurmctld restarts or reconfigures (the chaos campaign found a
    restart draining it again, without a word, when slurm.conf declared spares)."""
    from hyperpod_agent.slurm.client import SlurmClient

    cluster = LocalCluster(tmp_path / "c", nodes=1, spares=1, port_base=21117)
    try:
        cluster.up(timeout=60)
        slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
        spare = slurm.node("node2")
        assert spare.drained and spare.reason == "hyperpod:spare", spare
        slurm.resume("node2")  # as the spare-pool provider does
        cluster.wait_idle(["node2"], timeout=30)
        procs.stop([cluster.owned_pids()["slurmctld"]])
        cluster._start_slurmctld()  # noqa: SLF001 - the restart under test
        cluster.wait_idle(["node1", "node2"], timeout=60)
        res = run(["scontrol", "reconfigure"], env=cluster.env)
        assert res.returncode == 0, res.stderr
        time.sleep(1)  # reconfigure applies slurm.conf at once; one more look after it
        assert not slurm.node("node2").drained, slurm.node("node2")
    finally:
        cluster.down()


def test_up_after_a_crash_handles_stale_pid_files(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", nodes=1, spares=0, port_base=19917)
    try:
        cluster.up(timeout=60)
        for pid in cluster.owned_pids().values():
            os.kill(pid, 9)
        time.sleep(0.5)
        assert not cluster.running()
        assert cluster.up(timeout=60) is True
        assert cluster.node_states()["node1"] == "IDLE"
    finally:
        cluster.down()
    assert _leftovers(cluster) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nodes", "-1"], "--nodes"),
        (["--nodes", "0"], "--nodes"),
        (["--spares", "-2"], "--spares"),
        (["--nodes", "abc"], "--nodes"),
        (["--dir", "/proc/hyperpod-cannot-write"], "cannot write"),
        (["--port-base", "70000"], "port"),
    ],
)
def test_bad_input_is_one_line_and_starts_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    argv = [
        *HYPERPOD,
        "local-cluster",
        "up",
        "--dir",
        str(tmp_path / "c"),
        "--port-base",
        "20017",
        *args,
    ]
    res = run(argv)
    assert res.returncode != 0
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "c" / "run").exists() or not list((tmp_path / "c" / "run").glob("*.pid"))


def test_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 20117 + 11))  # node1's port
        s.listen()
        res = run(
            [
                *HYPERPOD,
                "local-cluster",
                "up",
                "--dir",
                str(tmp_path / "c"),
                "--nodes",
                "1",
                "--spares",
                "0",
                "--port-base",
                "20117",
            ]
        )
    assert res.returncode != 0
    assert "port 20128 on 127.0.0.1 is in use" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert LocalCluster(tmp_path / "c", 1, 0, 20117).owned_pids() == {}


def test_commands_on_a_missing_cluster_fail_clearly(tmp_path: Path) -> None:
    res = run([*HYPERPOD, "local-cluster", "status", "--dir", str(tmp_path / "none")])
    assert res.returncode != 0
    assert "no local cluster in" in res.stderr
    res = run([*HYPERPOD, "local-cluster", "down", "--dir", str(tmp_path / "none")])
    assert res.returncode == 0


def test_non_root_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    argv = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        *HYPERPOD,
        "local-cluster",
        "up",
        "--dir",
        str(tmp_path / "c"),
        "--port-base",
        "20217",
    ]
    res = run(argv, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert res.returncode != 0
    assert "needs root" in res.stderr
    assert "Traceback" not in res.stderr


def test_node_reboot_gives_a_new_boot_time_and_refuses_a_second_at_once(
    local_cluster: LocalCluster,
) -> None:
    import fcntl

    from hyperpod_agent.errors import LocalClusterError
    from hyperpod_agent.slurm.client import SlurmClient

    slurm = SlurmClient(slurm_conf=local_cluster.slurm_conf)
    before = slurm.node("node4")
    old_pid = local_cluster.slurmd_pid("node4")
    with open(local_cluster.dir / "run" / "reboot-node4.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(LocalClusterError, match="already under way"):
            local_cluster.node_reboot("node4")
    assert local_cluster.slurmd_pid("node4") == old_pid
    new_pid = local_cluster.node_reboot("node4")
    assert new_pid != old_pid
    # The node shows IDLE from before until the new slurmd registers (after its
    # HealthCheckProgram ran): wait for the new boot time itself.
    assert before.boot_time is not None
    boot = before.boot_time
    drill.wait_for(
        "node4 registered with a new boot time",
        30,
        lambda: (slurm.node("node4").boot_time or boot) > boot,
    )
    local_cluster.wait_idle(["node4"], timeout=30)


def test_tasks_get_a_per_node_checkpoint_memory_tier(local_cluster: LocalCluster) -> None:
    res = run(
        [
            "srun",
            "-N2",
            "sh",
            "-c",
            'echo "$(hostname) $HYPERPOD_CHECKPOINT_MEMORY_DIR $HYPERPOD_PROGRESS_DIR"',
        ],
        env=local_cluster.env,
    )
    assert res.returncode == 0, res.stderr
    lines = sorted(res.stdout.split("\n")[:-1])
    root = str(local_cluster.shape.memory_root)
    for line in lines:
        host, memdir, progress = line.split()
        assert memdir.startswith(f"{root}/{host}/")
        assert progress == f"{local_cluster.shape.progress_root}/{host}"
    assert len({ln.split()[1] for ln in lines}) == 2
