"""The local cluster's standby pair (``up --with-services --ha``): a real PostgreSQL
holding the state store, and two controllers on it, one leading.

The database lives in DIR/pg (its own data directory, loopback port port-base + 4,
its own role with a password in DIR/etc/pg-password) and is removed by ``down``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import time
import urllib.request
from pathlib import Path

from hyperpod_agent.controller.config import HaConfig
from hyperpod_agent.localcluster import procs
from hyperpod_agent.localcluster.postgres import PostgresServer, require_binaries
from hyperpod_agent.localcluster.shape import Shape

DATABASE = "hyperpod"
ROLE = "hyperpod"
CONTROLLERS = ("controller", "controller-b")  # the first leads at start
# The shipped lease, as an admin gets it: the drills and bench/failover.py measure it.
LEASE_TTL_S = HaConfig.model_fields["lease_ttl_s"].default
RENEW_EVERY_S = HaConfig.model_fields["renew_every_s"].default


def controller_port(shape: Shape, name: str) -> int:
    return shape.port_base + 2 + CONTROLLERS.index(name)


def database_port(shape: Shape) -> int:
    return shape.port_base + 4


def password_file(shape: Shape) -> Path:
    return shape.dir / "etc" / "pg-password"


def database_url(shape: Shape) -> str:
    return f"postgresql://{ROLE}@127.0.0.1:{database_port(shape)}/{DATABASE}"


def _pidfile(shape: Shape) -> Path:
    return shape.dir / "run" / "proc-postgres.pid"


def database_pid(shape: Shape) -> int | None:
    return procs.read_pidfile(_pidfile(shape))


def start_database(shape: Shape, fresh: bool = True, timeout_s: float = 60.0) -> int:
    """Start the cluster's database and return the server's pid. ``fresh``: a new one
    (whatever an earlier run left is removed); else the stopped one again, as it was."""
    if fresh:
        stop_database(shape)
    server = PostgresServer(shape.dir / "pg", database_port(shape), require_binaries())
    if fresh:
        server.base.mkdir(parents=True)
        server.init()
    else:
        server.adopt_data()
    # The store's durability is not what the local cluster shows: spare the disk.
    pid = server.start_detached({"fsync": "off", "full_page_writes": "off"}, timeout_s)
    procs.write_pidfile(_pidfile(shape), pid)
    if fresh:
        password = secrets.token_urlsafe(24)
        server.create_database(DATABASE, ROLE, password)
        path = password_file(shape)
        path.touch(mode=0o600)
        path.write_text(password + "\n")
    return pid


def stop_database(shape: Shape, remove: bool = True, timeout_s: float = 30.0) -> None:
    """Fast shutdown (SIGINT, which disconnects clients), KILL after ``timeout_s``.
    With ``remove`` the data directory and the password file go too."""
    pid = database_pid(shape)
    if pid is not None:
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and procs.alive(pid):
            time.sleep(0.05)
        procs.stop([pid], timeout=1)
    _pidfile(shape).unlink(missing_ok=True)
    if remove:
        shutil.rmtree(shape.dir / "pg", ignore_errors=True)
        password_file(shape).unlink(missing_ok=True)


def leader_gauge(url: str) -> float | None:
    """``hyperpod_controller_leader`` of the controller at ``url`` (its /metrics is
    served without the database); None when it does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    found = re.search(r"^hyperpod_controller_leader (\S+)$", text, re.M)
    return float(found.group(1)) if found else None
