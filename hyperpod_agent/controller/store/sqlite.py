"""The state store on SQLite: one file in WAL mode, one connection behind a lock.

Durability: with WAL, ``synchronous=NORMAL`` keeps every committed transaction across
a process crash (kill -9): the WAL frames are already in the OS page cache. It can lose
the last commits on a power loss. That is acceptable for reports, heartbeats and events
(agents resend; the loop re-reads Slurm), so they commit with NORMAL. Actions and
tracked jobs are the intent log that makes a crash between "decide" and "apply" yield
exactly one action, so they commit with ``synchronous=FULL`` (fsync of the WAL on
every commit); they are rare, so the cost is nil.
"""

from __future__ import annotations

import fcntl
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from hyperpod_agent.controller.store.dialect import SQLITE, Tx
from hyperpod_agent.errors import ConfigError, HyperpodError


class SqliteBackend:
    """One SQLite file. Thread-safe: one connection behind a lock."""

    dialect = SQLITE

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.where = str(path)
        try:
            if str(path) != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(path), isolation_level=None, check_same_thread=False, timeout=30.0
            )
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"{path}: cannot open state database: {exc}") from exc
        self._lock = threading.RLock()
        self._claim: IO[str] | None = None
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")

    def close(self) -> None:
        with self._lock:
            self._db.close()
        if self._claim is not None:
            self._claim.close()

    def claim(self) -> None:
        """Keep any other controller off this file while this one runs: an flock on
        ``<file>.lock``, released when it closes or the process dies."""
        path = self.path.with_name(self.path.name + ".lock")
        try:
            handle = path.open("a")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot create lock file: {exc.strerror}") from exc
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            raise HyperpodError(
                f"{self.path}: another controller is running on this state"
            ) from exc
        self._claim = handle

    @property
    def in_transaction(self) -> bool:
        return self._db.in_transaction

    @contextmanager
    def tx(self, durable: bool) -> Iterator[Tx]:
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

    def query(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def lock_schema(self, db: Tx) -> None:
        """Nothing to do: ``BEGIN IMMEDIATE`` already excludes every other writer."""
