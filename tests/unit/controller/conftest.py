"""The controller's store on both backends: SQLite in the test's directory, and a
fresh database on one real PostgreSQL server started for the session.

PostgreSQL missing is a failure, not a skip: scripts/setup.sh installs it.
"""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from store_helpers import PG_PASSWORD, PG_ROLE, StoreTarget, port_free

from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.url import PostgresLocation, parse_store_url
from hyperpod_agent.localcluster.postgres import (
    PostgresError,
    PostgresServer,
    require_binaries,
    start_postgres,
)

PG_PORTS = range(18400, 18500)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    try:
        require_binaries()
    except PostgresError as exc:
        pytest.fail(f"PostgreSQL tests cannot run: {exc}", pytrace=False)
    # Other checkouts may run their own server in the range: try a few free ports.
    errors: list[str] = []
    for port in random.sample(PG_PORTS, 8):
        if not port_free(port):
            continue
        try:
            # No fsync: no test crashes the server; the commits' durability settings
            # are still what the store asks for.
            server = start_postgres(port, settings={"fsync": "off"}, timeout_s=60)
        except PostgresError as exc:
            errors.append(str(exc))
            continue
        break
    else:
        pytest.fail(f"no PostgreSQL server started in 18400-18499: {errors}", pytrace=False)
    try:
        yield server
    finally:
        server.remove()


def new_pg_database(server: PostgresServer, directory: Path) -> PostgresLocation:
    """A fresh database owned by the test role, and its password file in ``directory``."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    url = server.create_database(name, PG_ROLE, PG_PASSWORD)
    password_file = directory / f"{name}.password"
    password_file.write_text(PG_PASSWORD + "\n")
    password_file.chmod(0o600)
    location = parse_store_url(url)
    assert isinstance(location, PostgresLocation)
    return location.model_copy(update={"password_file": password_file})


@pytest.fixture
def pg_location(pg_server: PostgresServer, tmp_path: Path) -> PostgresLocation:
    return new_pg_database(pg_server, tmp_path)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def new_target(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], StoreTarget]:
    """Makes empty stores' locations on this test's backend: a new SQLite file, or a
    new database on the session's PostgreSQL server."""
    count = iter(range(1000))
    if request.param == "sqlite":
        return lambda: tmp_path / f"state{next(count)}.db"
    server = request.getfixturevalue("pg_server")
    return lambda: new_pg_database(server, tmp_path)


@pytest.fixture
def store_target(new_target: Callable[[], StoreTarget]) -> StoreTarget:
    return new_target()


@pytest.fixture
def open_store() -> Iterator[Callable[[StoreTarget], Store]]:
    """Opens stores and closes them all after the test (a PostgreSQL pool has threads)."""
    opened: list[Store] = []

    def open_(target: StoreTarget) -> Store:
        opened.append(Store(target))
        return opened[-1]

    yield open_
    for s in opened:
        with contextlib.suppress(Exception):
            s.close()


@pytest.fixture
def store(store_target: StoreTarget, open_store: Callable[[StoreTarget], Store]) -> Store:
    return open_store(store_target)
