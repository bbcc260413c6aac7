"""A real munged for tests, started and stopped by pid (needs root)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

NOBODY = 65534


def start_munged(base: Path, name: str) -> tuple[Path, int]:
    where = base / name
    where.mkdir()
    where.chmod(0o755)  # munged refuses a socket directory others cannot traverse
    key = where / "munge.key"
    subprocess.run(
        ["mungekey", "-c", "-k", str(key), "-b", "1024"],
        check=True,
        timeout=30,
        capture_output=True,
    )
    key.chmod(0o400)
    sock, pidfile = where / "munge.sock", where / "munged.pid"
    subprocess.run(
        [
            "munged",
            f"--socket={sock}",
            f"--key-file={key}",
            f"--pid-file={pidfile}",
            f"--seed-file={where / 'munged.seed'}",
            f"--log-file={where / 'munged.log'}",
        ],
        check=True,
        timeout=30,
        capture_output=True,
    )
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"munged in {where} wrote no pid file")
        time.sleep(0.05)
    return sock, int(pidfile.read_text())


def stop_daemon(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def encode_as_nobody(sock: Path, payload: str) -> str:
    """A credential made by an unprivileged user (uid/gid 65534)."""
    out = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "munge",
            "-S",
            str(sock),
            "-s",
            payload,
        ],
        check=True,
        timeout=30,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()
