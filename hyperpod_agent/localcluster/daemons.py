"""Starting the local cluster's daemons: munged with its own key and socket, and
detached processes (slurmctld, slurmd, the hyperpod services)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from hyperpod_agent.errors import LocalClusterError
from hyperpod_agent.localcluster.shape import Shape

SBIN = Path("/usr/sbin")


def preflight(shape: Shape) -> None:
    """What must hold before the cluster starts anything: root, sane counts and
    ports, Slurm and munge installed, a writable directory."""
    if os.geteuid() != 0:
        raise LocalClusterError("the local cluster needs root (it runs slurmd and munged)")
    if shape.nodes < 1 or shape.spares < 0:
        raise LocalClusterError("--nodes must be >= 1 and --spares >= 0")
    if shape.nodes + shape.spares > 64:
        raise LocalClusterError("at most 64 nodes fit on one machine")
    if not (1024 <= shape.port_base and max(shape.ports) <= 65535):
        raise LocalClusterError(f"--port-base {shape.port_base} leaves the port range")
    for tool in ("slurmctld", "slurmd", "munged"):
        if not (SBIN / tool).exists():
            raise LocalClusterError(
                f"{SBIN / tool} is missing: apt-get install slurmd slurmctld slurm-client munge"
            )
    try:
        shape.dir.mkdir(parents=True, exist_ok=True)
        probe = shape.dir / ".write-test"
        probe.write_text("x")
        probe.unlink()
    except OSError as exc:
        raise LocalClusterError(f"cannot write to {shape.dir}: {exc.strerror}") from None


def ports_free(ports: list[int]) -> None:
    """Raise naming the first of ``ports`` already in use on 127.0.0.1."""
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                raise LocalClusterError(
                    f"port {port} on 127.0.0.1 is in use: choose another --port-base"
                ) from None


def start_munged(mdir: Path, socket: Path, log: Path) -> int:
    """Start munged (daemonizing itself) with a key of its own; its pid."""
    mdir.chmod(0o755)  # munged refuses a socket dir without o+x
    key = mdir / "munge.key"
    if not key.exists():
        subprocess.run(
            ["mungekey", "-c", "-k", str(key), "-b", "1024"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        key.chmod(0o400)
    pidfile = mdir / "munged.pid"
    res = subprocess.run(
        [
            str(SBIN / "munged"),
            f"--socket={socket}",
            f"--key-file={key}",
            f"--pid-file={pidfile}",
            f"--seed-file={mdir / 'munged.seed'}",
            f"--log-file={log}",
            "--num-threads=4",
            "--force",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if res.returncode != 0:
        raise LocalClusterError(f"munged failed to start: {res.stderr.strip()} (log: {log})")
    return int(pidfile.read_text().split()[0])


def spawn(argv: list[str], log: Path, env: dict[str, str]) -> int:
    """Start a daemon in its own session, detached from us: no Popen object that
    would outlive its process; output appended to ``log``."""
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    return os.posix_spawnp(argv[0], argv, env, file_actions=actions, setsid=True)


def cluster_env(shape: Shape) -> dict[str, str]:
    """Our environment with Slurm's commands pointed at the cluster's slurm.conf."""
    return {**os.environ, "SLURM_CONF": str(shape.slurm_conf)}


def start_process(
    shape: Shape, argv: list[str], logname: str, env: dict[str, str] | None = None
) -> int:
    """``spawn`` with the cluster's environment (plus ``env``), output appended to
    DIR/log/``logname``; returns the pid."""
    return spawn(argv, shape.dir / "log" / logname, {**cluster_env(shape), **(env or {})})


def log_tail(path: Path, lines: int = 3) -> str:
    """The last lines of a daemon's log, on one line, for error messages."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {path})"
    return " | ".join(text[-lines:]) if text else f"({path} is empty)"


def drain_spares(slurm_conf: Path, spares: list[str], timeout: float) -> None:
    """The spares out of service as ``hyperpod:spare`` before any slurmd registers,
    the way docs/manual-install.md declares them (scontrol, not slurm.conf: every
    slurmctld restart and reconfigure would apply a State=DRAIN line again)."""
    from hyperpod_agent.errors import SlurmError
    from hyperpod_agent.localcluster.render import SPARE_REASON
    from hyperpod_agent.slurm.client import SlurmClient

    slurm = SlurmClient(slurm_conf=slurm_conf, timeout=5)
    deadline = time.monotonic() + timeout
    for name in spares:
        while True:
            try:
                slurm.drain(name, SPARE_REASON)
                break
            except SlurmError as exc:  # slurmctld still starting
                if time.monotonic() > deadline:
                    raise LocalClusterError(
                        f"{name}: could not drain it as a spare: {exc}"
                    ) from None
                time.sleep(0.2)
