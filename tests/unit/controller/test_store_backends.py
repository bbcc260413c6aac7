"""Opening and migrating the store on either backend: ``hyperpod controller migrate``,
bad input refused in one line with nothing written, and what only PostgreSQL has
(several processes on one database)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from store_helpers import OPEN_IN_CHILD, StoreTarget, target_argv

from hyperpod_agent.controller.cli import controller
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.schema import MIGRATIONS
from hyperpod_agent.controller.store.url import PostgresLocation
from hyperpod_agent.errors import ConfigError, HyperpodError

OpenStore = Callable[[StoreTarget], Store]
LATEST = len(MIGRATIONS)


def write_config(tmp_path: Path, target: StoreTarget | str, password_file: Path | None) -> Path:
    if isinstance(target, Path):
        text = f'state_db = "{target}"\n'
    else:
        url = target.url if isinstance(target, PostgresLocation) else target
        text = f'store = "{url}"\n'
        if password_file is not None:
            text += f'store_password_file = "{password_file}"\n'
    path = tmp_path / "controller.toml"
    path.write_text(text)
    return path


def config_for(tmp_path: Path, target: StoreTarget) -> Path:
    pw = target.password_file if isinstance(target, PostgresLocation) else None
    return write_config(tmp_path, target, pw)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hyperpod_agent.controller.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def version_of(target: StoreTarget) -> int:
    store = Store(target, migrate=False)
    try:
        return store.schema_version()
    finally:
        store.close()


def test_migrate_upgrades_and_prints_the_version_before_and_after(
    store_target: StoreTarget, tmp_path: Path
) -> None:
    Store(store_target, migrations=MIGRATIONS[:1]).close()
    cfg = config_for(tmp_path, store_target)
    first = CliRunner().invoke(controller, ["migrate", "--config", str(cfg)])
    assert first.exit_code == 0, first.output
    assert first.output.strip().endswith(f": schema version 1 -> {LATEST}")
    again = CliRunner().invoke(controller, ["migrate", "--config", str(cfg)])
    assert again.output.strip().endswith(f": schema version {LATEST} -> {LATEST}")
    assert version_of(store_target) == LATEST


@pytest.mark.parametrize("command", ["migrate", "run"])
def test_a_newer_schema_is_refused_in_one_line_changing_nothing(
    store_target: StoreTarget, tmp_path: Path, open_store: OpenStore, command: str
) -> None:
    store = open_store(store_target)
    with store._tx() as db:
        db.execute("UPDATE schema_version SET version=99")
    store.close()
    proc = run_cli(command, "--config", str(config_for(tmp_path, store_target)))
    assert proc.returncode == 3 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert line.endswith(
        f"schema version 99 is newer than this controller ({LATEST}); refusing to downgrade"
    )
    assert version_of(store_target) == 99


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released, here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    port = _closed_port()
    cfg = write_config(tmp_path, f"postgresql://hyperpod@127.0.0.1:{port}/ctl", None)
    proc = run_cli("migrate", "--config", str(cfg))
    assert proc.returncode == 3 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"hyperpod: error: postgresql://hyperpod@127.0.0.1:{port}/ctl: cannot connect: "
        f'connection to server at "127.0.0.1", port {port} failed: Connection refused'
    ]


@pytest.mark.pg
def test_a_wrong_password_is_one_line_and_writes_nothing(
    pg_location: PostgresLocation, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    wrong.chmod(0o600)
    proc = run_cli("migrate", "--config", str(write_config(tmp_path, pg_location, wrong)))
    assert proc.returncode == 3 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"hyperpod: error: {pg_location.url}: cannot connect: ")
    assert line.endswith(f'password authentication failed for user "{pg_location.user}"')
    assert "not-the-password" not in proc.stderr
    assert version_of(pg_location) == 0  # not even the schema_version table


@pytest.mark.pg
def test_a_missing_password_file_names_it(pg_location: PostgresLocation, tmp_path: Path) -> None:
    absent = tmp_path / "absent.password"
    with pytest.raises(ConfigError, match=f"store_password_file {absent}: cannot read"):
        Store(pg_location.model_copy(update={"password_file": absent}))


@pytest.mark.pg
def test_intents_commit_synchronously_and_reports_need_not(
    pg_location: PostgresLocation, open_store: OpenStore
) -> None:
    store = open_store(pg_location)
    with store._tx(durable=True) as db:
        assert db.execute("SHOW synchronous_commit").fetchone() == ("on",)
    with store._tx() as db:
        assert db.execute("SHOW synchronous_commit").fetchone() == ("off",)


@pytest.mark.pg
def test_controllers_starting_together_migrate_once(
    pg_location: PostgresLocation, open_store: OpenStore
) -> None:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            open_store(pg_location)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and not any(t.is_alive() for t in threads)
    store = open_store(pg_location)
    assert store._query("SELECT version FROM schema_version") == [(LATEST,)]


def test_concurrent_writers_and_readers_lose_nothing(store: Store) -> None:
    per_thread = 25
    errors: list[BaseException] = []
    ids: list[int] = []

    def work(n: int) -> None:
        try:
            for i in range(per_thread):
                ids.append(store.add_action("drain", f"node{n}", None, "r", "c", float(i)))
                store.record_report(f"node{n}", "a", i, float(i), "healthy", "{}", [], float(i))
                store.record_heartbeats({f"node{n}": ("a", i, float(i))})
                store.node_actions(f"node{n}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert len(set(ids)) == 4 * per_thread == len(store.open_actions())
    assert {name: row.seq for name, row in store.node_rows().items()} == {
        f"node{n}": per_thread - 1 for n in range(4)
    }


@pytest.mark.pg
def test_a_second_controller_on_the_same_database_is_refused(
    pg_location: PostgresLocation, open_store: OpenStore
) -> None:
    first, second = open_store(pg_location), open_store(pg_location)
    first.claim()
    with pytest.raises(HyperpodError, match=r"another controller is running on this state$"):
        second.claim()
    first.close()  # its claim ends with it (and with its process)
    second.claim()


def test_a_second_controller_process_on_the_same_state_is_refused(
    store_target: StoreTarget, open_store: OpenStore
) -> None:
    open_store(store_target).claim()
    proc = subprocess.run(
        [sys.executable, "-c", OPEN_IN_CHILD + "s.claim()\n", *target_argv(store_target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert (
        proc.stderr.strip().splitlines()[-1].endswith("another controller is running on this state")
    )
