"""``store`` and ``store_password_file`` in controller.toml: strict, and a password
never travels in the URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperpod_agent.controller.config import parse_config
from hyperpod_agent.controller.store.url import (
    PostgresLocation,
    SqliteLocation,
    parse_store_url,
    read_password,
)
from hyperpod_agent.errors import ConfigError

CFG = Path("/etc/hyperpod/controller.toml")


def location(text: str) -> SqliteLocation | PostgresLocation:
    return parse_config(text, CFG).store_location()


def test_absent_is_sqlite_at_state_db() -> None:
    assert location("") == SqliteLocation(path=Path("/var/lib/hyperpod/controller.db"))
    assert location('state_db = "/srv/c.db"') == SqliteLocation(path=Path("/srv/c.db"))


def test_sqlite_url_names_the_file() -> None:
    assert location('store = "sqlite:///srv/state.db"') == SqliteLocation(
        path=Path("/srv/state.db")
    )


def test_postgresql_url_with_password_file() -> None:
    got = location(
        'store = "postgresql://hyperpod@db.example:5433/ctl?sslmode=verify-full"\n'
        'store_password_file = "/etc/hyperpod/store.password"\n'
    )
    assert got == PostgresLocation(
        user="hyperpod",
        host="db.example",
        port=5433,
        dbname="ctl",
        sslmode="verify-full",
        password_file=Path("/etc/hyperpod/store.password"),
    )
    assert got.url == "postgresql://hyperpod@db.example:5433/ctl?sslmode=verify-full"


def test_default_port_and_ipv6_host() -> None:
    got = parse_store_url("postgresql://u@[::1]/db")
    assert isinstance(got, PostgresLocation)
    assert (got.host, got.port, got.url) == ("::1", 5432, "postgresql://u@[::1]:5432/db")


def test_a_password_in_the_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as err:
        location('store = "postgresql://u:hunter2@h:5432/db"')
    message = str(err.value)
    assert "hunter2" not in message and len(message.splitlines()) == 1
    assert message.startswith(f"{CFG}: store:") and "store_password_file" in message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('store = "mysql://u@h/db"', "store: Value error, must be postgresql://"),
        ('store = "postgres://u@h/db"', "store: Value error, must be postgresql://"),
        ('store = "postgresql://h:5432/db"', "postgresql://user@host:port/database"),
        ('store = "postgresql://u@:5432/db"', "postgresql://user@host:port/database"),
        ('store = "postgresql://u@h:99999/db"', "port must be a number"),
        ('store = "postgresql://u@h:x/db"', "port must be a number"),
        ('store = "postgresql://u@h:5432"', "must name one database"),
        ('store = "postgresql://u@h:5432/a/b"', "must name one database"),
        ('store = "postgresql://u@h/db?password=x"', "unsupported URL parameter 'password'"),
        ('store = "postgresql://u@h/db?sslmode=maybe"', "sslmode must be one of"),
        ('store = "postgresql://u@h/db#x"', "must not have a #fragment"),
        ('store = "sqlite://relative/x.db"', "sqlite:///absolute/path"),
        ('store = "sqlite:///x.db?mode=ro"', "sqlite:///absolute/path"),
        ('store = "sqlite:///x.db"\nstore_password_file = "/p"', "only a postgresql:// store"),
        ('store = "postgresql://u@h/db"\nstore_password_file = "p"', "must be an absolute path"),
        ("store = 5", "store: Input should be a valid string"),
    ],
)
def test_bad_store_settings_name_the_key(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=r"^/etc/hyperpod/controller.toml: ") as err:
        location(text)
    assert needle in str(err.value) and len(str(err.value).splitlines()) == 1


def test_password_file_first_line(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("s3cret\n")
    path.chmod(0o600)
    assert read_password(path) == "s3cret"


@pytest.mark.parametrize(
    ("content", "mode", "needle"),
    [("s3cret\n", 0o644, "readable by others"), ("\n", 0o600, "empty"), ("", 0o600, "empty")],
)
def test_bad_password_file(tmp_path: Path, content: str, mode: int, needle: str) -> None:
    path = tmp_path / "pw"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(ConfigError, match=f"store_password_file {path}: {needle}"):
        read_password(path)


def test_missing_password_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="store_password_file .*: cannot read"):
        read_password(tmp_path / "absent")
