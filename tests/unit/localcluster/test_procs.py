import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyperpod_agent.localcluster import procs


def test_pidfile_round_trip_and_stale(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pf = tmp_path / "x.pid"
        procs.write_pidfile(pf, p.pid)
        assert procs.read_pidfile(pf) == p.pid
        assert procs.read_pidfile(pf, "python") == p.pid
        assert procs.read_pidfile(pf, "slurmd") is None  # not the binary we expect
        procs.stop([p.pid], timeout=5)
        p.wait(timeout=5)
        assert procs.read_pidfile(pf) is None  # stale pid file after a crash
    finally:
        p.kill()
        p.wait()


def test_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    pf = tmp_path / "x.pid"
    pf.write_text(f"{os.getpid()} 1\n")  # our pid, but a different start time
    assert procs.read_pidfile(pf) is None


def test_garbage_pidfile(tmp_path: Path) -> None:
    pf = tmp_path / "x.pid"
    pf.write_text("not a pid")
    assert procs.read_pidfile(pf) is None
    assert procs.read_pidfile(tmp_path / "missing.pid") is None


def test_stop_kills_what_ignores_term() -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        import time

        time.sleep(0.3)
        assert procs.alive(p.pid)
        procs.stop([p.pid], timeout=0.5)
        assert not procs.alive(p.pid)  # SIGTERM was ignored: only SIGKILL ends it
    finally:
        p.kill()
        p.wait()


@pytest.mark.root
def test_host_namespace_is_never_swept(tmp_path: Path) -> None:
    from hyperpod_agent.localcluster.cluster import LocalCluster

    cluster = LocalCluster(tmp_path, nodes=1, spares=0, port_base=30000)
    pin = tmp_path / "run" / "ns" / "node1.1"
    pin.parent.mkdir(parents=True)
    pin.touch()
    # A pinned namespace that is the host's own must not make `down` kill every
    # process of the machine.
    subprocess.run(["mount", "--bind", "/proc/self/ns/uts", str(pin)], check=True, timeout=10)
    try:
        assert cluster.namespace_pids() == []
    finally:
        subprocess.run(["umount", str(pin)], check=True, timeout=10)
