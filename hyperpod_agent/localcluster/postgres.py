"""A throwaway PostgreSQL server for tests and the local cluster.

``initdb`` in a directory of its own, ``postgres`` on 127.0.0.1 and a given port with
its socket inside that directory, roles and databases created over the socket, a fast
shutdown and the directory removed. PostgreSQL refuses to run as root, so a root caller
runs it as an unprivileged system user (created on first use).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.localcluster import daemons, procs

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_USER = "hyperpod-pg"  # the system user a root caller runs the server as
SUPERUSER = "postgres"  # the server's superuser role, reachable over the socket only


class PostgresError(HyperpodError):
    """The test server could not be set up, started or stopped."""


def require_binaries(bin_dir: Path = PG_BIN) -> Path:
    """``bin_dir`` when it holds initdb and postgres, else a PostgresError saying how to
    get them."""
    for name in ("initdb", "postgres"):
        if not os.access(bin_dir / name, os.X_OK):
            raise PostgresError(
                f"{bin_dir / name}: not installed; scripts/setup.sh installs the "
                "'postgresql' package"
            )
    return bin_dir


def _ensure_user(name: str) -> pwd.struct_passwd:
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    proc = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    try:  # exit 9: another process created it meanwhile
        return pwd.getpwnam(name)
    except KeyError:
        raise PostgresError(f"useradd {name}: {proc.stderr.strip() or proc.returncode}") from None


class PostgresServer:
    """One server process and its directory. Use :func:`start_postgres`."""

    def __init__(self, base: Path, port: int, bin_dir: Path) -> None:
        self.base = base
        self.data = base / "data"
        self.port = port
        self.bin_dir = bin_dir
        self.log_path = base / "postgres.log"
        self._user: pwd.struct_passwd | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs (its backends are its children)."""
        return self._proc.pid if self._proc is not None else None

    # -- lifecycle ------------------------------------------------------------------
    def _run_as(self) -> dict[str, Any]:
        if self._user is None:
            return {}
        return {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}

    def adopt_data(self) -> None:
        """Use the data directory an earlier :meth:`init` made (a restart)."""
        if not (self.data / "PG_VERSION").exists():
            raise PostgresError(f"{self.data}: no database directory to start")
        if os.geteuid() == 0:
            self._user = _ensure_user(PG_USER)

    def init(self) -> None:
        if os.geteuid() == 0:
            self._user = _ensure_user(PG_USER)
            os.chown(self.base, self._user.pw_uid, self._user.pw_gid)
        proc = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            **self._run_as(),
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [str(proc.returncode)])[-1]
            raise PostgresError(f"initdb {self.data}: {last}")

    def _argv(self, settings: Mapping[str, str]) -> list[str]:
        argv = [str(self.bin_dir / "postgres"), "-D", str(self.data)]
        argv += ["-h", "127.0.0.1", "-p", str(self.port), "-k", str(self.data)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        return argv

    def start(self, settings: Mapping[str, str], timeout_s: float) -> None:
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv
                self._argv(settings),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                **self._run_as(),
            )
        proc = self._proc
        try:
            self._wait_ready(timeout_s, lambda: proc.poll())
        except PostgresError:
            self.stop()
            raise

    def start_detached(self, settings: Mapping[str, str], timeout_s: float) -> int:
        """Start the server in a session of its own and return its pid. Unlike
        :meth:`start` it is no child the caller must wait for: the local cluster's
        database outlives the command that started it (stop it with SIGINT)."""
        argv = self._argv(settings)
        if self._user is not None:  # setpriv execs postgres: the pid stays the same
            user = self._user
            argv = [
                "setpriv",
                f"--reuid={user.pw_uid}",
                f"--regid={user.pw_gid}",
                "--clear-groups",
                *argv,
            ]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
        pid = daemons.spawn(argv, self.log_path, env)

        def exited() -> int | None:
            return None if procs.alive(pid) else -1

        try:
            self._wait_ready(timeout_s, exited)
        except PostgresError:
            procs.stop([pid])
            raise
        return pid

    def _wait_ready(self, timeout_s: float, exited: Callable[[], int | None]) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        last = "not started"
        while time.monotonic() < deadline:
            code = exited()
            if code is not None:
                raise PostgresError(
                    f"postgres on port {self.port} exited with {code}: {self.log_tail()}"
                )
            try:
                psycopg.connect(**self._admin_args(), connect_timeout=2).close()
                return
            except psycopg.OperationalError as exc:
                last = " ".join(str(exc).split())
            time.sleep(0.1)
        raise PostgresError(f"postgres on port {self.port}: not ready in {timeout_s:g} s: {last}")

    def log_tail(self) -> str:
        """Why the server stopped: the log's last FATAL/PANIC/ERROR line (without its
        timestamp), else its last line."""
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        for line in reversed(lines):
            for level in ("FATAL:", "PANIC:", "ERROR:"):
                if level in line:
                    return level + line.split(level, 1)[1]
        return lines[-1] if lines else "(empty log)"

    def stop(self, timeout_s: float = 30.0) -> None:
        """Fast shutdown (SIGINT), then SIGKILL after ``timeout_s``; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)

    def remove(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    # -- roles and databases --------------------------------------------------------
    def _admin_args(self) -> dict[str, Any]:
        return {
            "host": str(self.data),
            "port": self.port,
            "user": SUPERUSER,
            "dbname": "postgres",
            "autocommit": True,
        }

    def create_database(self, name: str, owner: str, password: str | None) -> str:
        """Create ``owner`` (if new, with ``password``) and the database ``name`` it
        owns; return its URL (without the password)."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(**self._admin_args()) as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname=%s", (owner,)).fetchone()
            if exists is None:
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(owner), sql.Literal(password)
                    )
                )
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(owner)
                )
            )
        return f"postgresql://{owner}@127.0.0.1:{self.port}/{name}"

    def drop_database(self, name: str) -> None:
        """Drop ``name``, disconnecting whoever still uses it."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(**self._admin_args()) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def start_postgres(
    port: int,
    *,
    base: Path | None = None,
    settings: Mapping[str, str] | None = None,
    bin_dir: Path = PG_BIN,
    timeout_s: float = 60.0,
) -> PostgresServer:
    """initdb a new directory (``base`` or a fresh one under the temp dir), start the
    server on 127.0.0.1:``port`` and wait until it accepts connections. The directory
    is removed again if anything fails."""
    require_binaries(bin_dir)
    if base is None:
        base = Path(tempfile.mkdtemp(prefix="hyperpod-pg-"))
    else:
        base.mkdir(parents=True, exist_ok=False)
    server = PostgresServer(base, port, bin_dir)
    try:
        server.init()
        server.start(settings or {}, timeout_s)
    except BaseException:
        server.remove()
        raise
    return server
