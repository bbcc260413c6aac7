"""The state store on PostgreSQL, through a pool of psycopg connections.

Durability as on SQLite (store/sqlite.py): the intent log (``durable=True``) commits
with ``synchronous_commit=on``, flushed to the server's WAL before the commit returns;
reports, heartbeats and events commit with ``synchronous_commit=off``, which may lose
the last commits if the server crashes but never corrupts or half-applies one.

Writes from one process are serialised by a lock, as on SQLite, so a transaction that
reads then writes (a report reconciling a node's open faults) sees no write of the
same process interleaved. Reads take any pooled connection and run concurrently.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from hyperpod_agent.controller.store.dialect import POSTGRESQL, Cursor, Tx
from hyperpod_agent.controller.store.url import PostgresLocation
from hyperpod_agent.errors import ConfigError, HyperpodError

# Advisory lock keys: migrations between controllers ("hypr"), and the one
# controller running on a database ("hypc").
_SCHEMA_LOCK = 0x68797072
_CONTROLLER_LOCK = 0x68797063


def one_line(exc: BaseException) -> str:
    """libpq's message without its "connection failed:" prefix and its hints."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    first = first.removeprefix("connection failed: ")
    return " ".join(first.split())


class _PgTx:
    """A pooled connection inside a transaction, taking the SQLite dialect."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        return self._conn.execute(POSTGRESQL.sql(sql), parameters)

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(POSTGRESQL.sql(sql), seq_of_parameters)


class PostgresBackend:
    """One PostgreSQL database. Thread-safe (a pool; writes behind a lock)."""

    dialect = POSTGRESQL

    def __init__(
        self,
        location: PostgresLocation,
        password: str | None,
        *,
        pool_size: int = 8,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.where = location.url
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(2, int(connect_timeout_s)),
            "application_name": "hyperpod-controller",
        }
        if password is not None:
            kwargs["password"] = password
        self._conninfo, self._kwargs = location.conninfo, kwargs
        self._claim: psycopg.Connection[Any] | None = None
        # One plain connection first: it fails with libpq's own reason (refused,
        # authentication, no such database) where the pool would only time out.
        try:
            psycopg.connect(location.conninfo, **kwargs).close()
        except psycopg.Error as exc:
            raise ConfigError(f"{self.where}: cannot connect: {one_line(exc)}") from exc
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            location.conninfo,
            kwargs=kwargs,
            min_size=1,
            max_size=pool_size,
            timeout=30.0,
            name="hyperpod-store",
            check=ConnectionPool.check_connection,
            open=False,
        )
        self._pool.open(wait=True, timeout=connect_timeout_s)
        self._lock = threading.RLock()

    def close(self) -> None:
        if self._claim is not None:
            self._claim.close()
        self._pool.close()

    def claim(self) -> None:
        """Keep any other controller off this database while this one runs: a
        session advisory lock on a connection of its own, released when it closes or
        the process dies."""
        conn = psycopg.connect(self._conninfo, **self._kwargs)
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (_CONTROLLER_LOCK,)).fetchone()
        if not (row and row[0]):
            conn.close()
            raise HyperpodError(f"{self.where}: another controller is running on this state")
        self._claim = conn

    @contextmanager
    def tx(self, durable: bool) -> Iterator[Tx]:
        with self._lock, self._pool.connection() as conn, conn.transaction():
            sync = "on" if durable else "off"
            conn.execute(f"SET LOCAL synchronous_commit TO {sync}")
            yield _PgTx(conn)

    def query(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._pool.connection() as conn:
            return conn.execute(POSTGRESQL.sql(sql), args).fetchall()

    def lock_schema(self, db: Tx) -> None:
        """Serialise migrations between controllers starting together."""
        db.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
