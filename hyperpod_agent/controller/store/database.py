"""The controller's state database: a backend (SQLite or PostgreSQL), its transactions
and the schema.

Both backends take the same SQL (store/dialect.py translates it for PostgreSQL) and
the same versioned migrations (store/schema.py). Intent-log writes commit durably on
both (store/sqlite.py, store/postgres.py say how).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from hyperpod_agent.controller.store.dialect import Dialect, Tx
from hyperpod_agent.controller.store.schema import MIGRATIONS
from hyperpod_agent.controller.store.url import PostgresLocation, StoreLocation, read_password
from hyperpod_agent.errors import ConfigError


class Backend(Protocol):
    dialect: Dialect
    where: str  # the file or URL, for messages

    def tx(self, durable: bool) -> Any: ...  # a context manager giving a Tx

    def query(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]: ...

    def lock_schema(self, db: Tx) -> None: ...

    def claim(self) -> None: ...

    def close(self) -> None: ...


def open_backend(target: Path | str | StoreLocation) -> Backend:
    """A path is a SQLite file; a location is what ``store`` in controller.toml says."""
    from hyperpod_agent.controller.store.sqlite import SqliteBackend

    if isinstance(target, PostgresLocation):
        from hyperpod_agent.controller.store.postgres import PostgresBackend

        password = None if target.password_file is None else read_password(target.password_file)
        return PostgresBackend(target, password)
    if isinstance(target, Path | str):
        return SqliteBackend(target)
    return SqliteBackend(target.path)


class Database:
    """The backend, its transactions and the schema. Thread-safe."""

    def __init__(
        self,
        target: Path | str | StoreLocation,
        *,
        migrations: Sequence[str] | None = None,
        migrate: bool = True,
    ) -> None:
        self._backend = open_backend(target)
        self.where = self._backend.where
        try:
            if migrate:
                self.migrate(migrations)
        except BaseException:
            self._backend.close()
            raise

    @property
    def path(self) -> Path:
        """The SQLite file (AttributeError on PostgreSQL)."""
        return Path(getattr(self._backend, "path"))  # noqa: B009 - SQLite only

    @property
    def dialect(self) -> Dialect:
        return self._backend.dialect

    def close(self) -> None:
        self._backend.close()

    def claim(self) -> None:
        """One controller per state: two would act twice on every fault. HyperpodError
        when another holds it."""
        self._backend.claim()

    @contextmanager
    def _tx(self, durable: bool = False) -> Iterator[Tx]:
        with self._backend.tx(durable) as db:
            yield db

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self._backend.query(sql, args)

    # -- schema ---------------------------------------------------------------------
    def schema_version(self) -> int:
        """The version of the schema in the database; 0 when it has none."""
        if not self._query(self.dialect.table_exists, ("schema_version",)):
            return 0
        got = self._query("SELECT version FROM schema_version")
        return int(got[0][0]) if got else 0

    def _begin_migration(self, db: Tx) -> int:
        self._backend.lock_schema(db)
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER)")
        got = db.execute("SELECT version FROM schema_version").fetchall()
        return int(got[0][0]) if got else 0

    def migrate(self, migrations: Sequence[str] | None = None) -> int:
        """Apply every migration newer than the database, each in its own transaction;
        refuse (changing nothing) a database newer than this controller."""
        steps = MIGRATIONS if migrations is None else migrations
        with self._tx(durable=True) as db:
            current = self._begin_migration(db)
            if current > len(steps):
                raise ConfigError(
                    f"{self.where}: schema version {current} is newer than this controller "
                    f"({len(steps)}); refusing to downgrade"
                )
        for version in range(current + 1, len(steps) + 1):
            with self._tx(durable=True) as db:
                # Another controller may have applied it meanwhile (PostgreSQL).
                if self._begin_migration(db) >= version:
                    continue
                for statement in self.dialect.ddl(steps[version - 1]):
                    db.execute(statement)
                db.execute("DELETE FROM schema_version")
                db.execute("INSERT INTO schema_version VALUES (?)", (version,))
        return self.schema_version()
