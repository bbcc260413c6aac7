"""The throwaway PostgreSQL server the store's tests (and the local cluster) use."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import tempfile
from pathlib import Path

import psutil
import psycopg
import pytest

from hyperpod_agent.localcluster.postgres import PG_USER, PostgresError, start_postgres

pytestmark = pytest.mark.pg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_start_create_connect_stop_and_remove() -> None:
    server = start_postgres(free_port())
    try:
        url = server.create_database("app", "app_user", "pw")
        assert url == f"postgresql://app_user@127.0.0.1:{server.port}/app"
        with psycopg.connect(url, password="pw") as conn:
            assert conn.execute("SELECT current_user, current_database()").fetchone() == (
                "app_user",
                "app",
            )
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(url, password="wrong")
        [proc] = [
            p
            for p in psutil.process_iter(["cmdline"])
            if str(server.data) in " ".join(p.info["cmdline"] or [])
            and p.info["cmdline"][0].endswith("postgres")
        ]
        if os.geteuid() == 0:  # postgres refuses root: it runs as its own user
            assert proc.uids().real == pwd.getpwnam(PG_USER).pw_uid
            assert (server.data / "postmaster.pid").stat().st_uid == pwd.getpwnam(PG_USER).pw_uid
        server.drop_database("app")
        with pytest.raises(psycopg.OperationalError, match='database "app" does not exist'):
            psycopg.connect(url, password="pw")
    finally:
        server.remove()
    assert not proc.is_running() and not server.base.exists()


def test_a_taken_port_fails_with_the_servers_reason_and_leaves_no_directory() -> None:
    # Not under tmp_path: pytest's directories are private to root, and the server's
    # own user must reach its directory.
    parent = Path(tempfile.mkdtemp(prefix="hyperpod-pg-test-"))
    try:
        parent.chmod(0o755)
        base = parent / "pg"
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = int(taken.getsockname()[1])
            with pytest.raises(
                PostgresError,
                match=f"port {port} exited with 1: FATAL:  could not create any TCP/IP",
            ):
                start_postgres(port, base=base, timeout_s=30)
        assert not base.exists()
    finally:
        shutil.rmtree(parent)


def test_missing_binaries_say_how_to_get_them(tmp_path: Path) -> None:
    with pytest.raises(PostgresError, match=r"initdb: not installed; scripts/setup.sh installs"):
        start_postgres(free_port(), bin_dir=tmp_path)


def test_the_local_clusters_database_outlives_its_starter_and_restarts_with_its_data() -> None:
    from hyperpod_agent.localcluster import ha
    from hyperpod_agent.localcluster.shape import Shape

    parent = Path(tempfile.mkdtemp(prefix="hyperpod-ha-test-"))
    parent.chmod(0o755)  # as the local cluster's directory: the server's user passes
    (parent / "etc").mkdir()
    (parent / "run").mkdir()
    shape = Shape(parent, nodes=1, spares=0, port_base=free_port() - 4, ha=True)
    try:
        pid = ha.start_database(shape)
        assert ha.database_pid(shape) == pid
        assert ha.password_file(shape).stat().st_mode & 0o777 == 0o600
        password = ha.password_file(shape).read_text().strip()
        url = ha.database_url(shape)
        with psycopg.connect(url, password=password, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            conn.execute("INSERT INTO kept VALUES (7)")
        ha.stop_database(shape, remove=False)
        assert ha.database_pid(shape) is None and not psutil.pid_exists(pid)
        ha.start_database(shape, fresh=False)
        with psycopg.connect(url, password=password) as conn:
            assert conn.execute("SELECT x FROM kept").fetchone() == (7,)
        ha.stop_database(shape)
        assert not (parent / "pg").exists() and not ha.password_file(shape).exists()
        with pytest.raises(PostgresError, match="no database directory"):
            ha.start_database(shape, fresh=False)
    finally:
        ha.stop_database(shape)
        shutil.rmtree(parent, ignore_errors=True)
