"""The controller's state: SQLite in WAL mode, one connection, explicit transactions.

Durability: with WAL, ``synchronous=NORMAL`` keeps every committed transaction across
a process crash (kill -9): the WAL frames are already in the OS page cache. It can lose
the last commits on a power loss. That is acceptable for reports, heartbeats and events
(agents resend; the loop re-reads Slurm), so they commit with NORMAL. Actions and
tracked jobs are the intent log that makes a crash between "decide" and "apply" yield
exactly one action, so they commit with ``synchronous=FULL`` (fsync of the WAL on
every commit); they are rare, so the cost is nil.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hyperpod_agent.controller.store_schema import MIGRATIONS
from hyperpod_agent.errors import ConfigError


class Database:
    """The connection, its transactions and the schema. Thread-safe: one connection
    behind a lock."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            if str(path) != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(path), isolation_level=None, check_same_thread=False, timeout=30.0
            )
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"{path}: cannot open state database: {exc}") from exc
        self._lock = threading.RLock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self.migrate()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self, durable: bool = False) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if durable:
                self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                # Also when COMMIT itself fails (disk full, I/O error, a deferred
                # constraint): a transaction left open would fail every later write.
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            finally:
                if durable:
                    self._db.execute("PRAGMA synchronous=NORMAL")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    # -- schema ---------------------------------------------------------------------
    def schema_version(self) -> int:
        rows = self._query(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='schema_version'"
        )
        if not rows:
            return 0
        got = self._query("SELECT version FROM schema_version")
        return int(got[0][0]) if got else 0

    def migrate(self, migrations: list[str] | None = None) -> int:
        """Apply every migration newer than the database, each in its own transaction."""
        steps = MIGRATIONS if migrations is None else migrations
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER)")
            current = self.schema_version()
            if current > len(steps):
                raise ConfigError(
                    f"{self.path}: schema version {current} is newer than this controller "
                    f"({len(steps)}); refusing to downgrade"
                )
            for version in range(current + 1, len(steps) + 1):
                with self._tx(durable=True) as db:
                    for statement in steps[version - 1].split(";"):
                        if statement.strip():
                            db.execute(statement)
                    db.execute("DELETE FROM schema_version")
                    db.execute("INSERT INTO schema_version VALUES (?)", (version,))
            return self.schema_version()

    # -- nodes and faults -----------------------------------------------------------
