"""Where the controller keeps its state: ``store`` in controller.toml.

Absent, or ``sqlite:///path``: a SQLite file (``state_db`` when absent).
``postgresql://user@host[:port]/database[?sslmode=...]``: a PostgreSQL database; the
password is read from ``store_password_file`` and never appears in the URL (a URL
with a password is refused), on a command line or in a message.
"""

from __future__ import annotations

import stat
import urllib.parse
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from hyperpod_agent.errors import ConfigError

SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


class SqliteLocation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path

    @property
    def url(self) -> str:
        return f"sqlite://{self.path}"


class PostgresLocation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str
    host: str
    port: int = 5432
    dbname: str
    sslmode: str | None = None
    password_file: Path | None = None

    @property
    def url(self) -> str:
        """The URL as configured (it never holds a password)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        quote = urllib.parse.quote
        tail = f"?sslmode={self.sslmode}" if self.sslmode else ""
        return f"postgresql://{quote(self.user)}@{host}:{self.port}/{quote(self.dbname)}{tail}"

    @property
    def conninfo(self) -> str:
        """libpq's keyword/value form, without the password."""
        from psycopg.conninfo import make_conninfo

        extra = {"sslmode": self.sslmode} if self.sslmode else {}
        return make_conninfo(
            host=self.host, port=self.port, user=self.user, dbname=self.dbname, **extra
        )


StoreLocation = SqliteLocation | PostgresLocation


def parse_store_url(value: str) -> StoreLocation:
    """Check ``value`` strictly; ValueError says what is wrong (never echoing a
    password)."""
    parts = urllib.parse.urlsplit(value)
    if parts.scheme == "sqlite":
        if parts.netloc or parts.query or parts.fragment or not parts.path.startswith("/"):
            raise ValueError("a SQLite store is sqlite:///absolute/path")
        return SqliteLocation(path=Path(urllib.parse.unquote(parts.path)))
    if parts.scheme != "postgresql":
        raise ValueError("must be postgresql://user@host:port/database or sqlite:///path")
    if parts.password is not None:
        raise ValueError("the URL must not carry a password; put it in store_password_file")
    if not parts.username or not parts.hostname:
        raise ValueError("a PostgreSQL store is postgresql://user@host:port/database")
    try:
        port = parts.port or 5432
    except ValueError:
        raise ValueError("the port must be a number from 1 to 65535") from None
    dbname = urllib.parse.unquote(parts.path.removeprefix("/"))
    if not dbname or "/" in dbname:
        raise ValueError("the URL must name one database: postgresql://user@host:port/database")
    if parts.fragment:
        raise ValueError("the URL must not have a #fragment")
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(query) - {"sslmode"})
    if unknown:
        raise ValueError(f"unsupported URL parameter {unknown[0]!r} (only sslmode)")
    sslmode = query.get("sslmode", [None])[-1]
    if sslmode is not None and sslmode not in SSLMODES:
        raise ValueError(f"sslmode must be one of {', '.join(SSLMODES)}")
    return PostgresLocation(
        user=urllib.parse.unquote(parts.username),
        host=parts.hostname,
        port=port,
        dbname=dbname,
        sslmode=sslmode,
    )


def read_password(path: Path) -> str:
    """The password in ``path`` (its first line). The file must not be readable by
    others, like libpq's .pgpass."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"store_password_file {path}: cannot read: {exc}") from exc
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise ConfigError(f"store_password_file {path}: readable by others; chmod 600 it")
    password = text.splitlines()[0] if text.strip() else ""
    if not password:
        raise ConfigError(f"store_password_file {path}: empty")
    return password


def store_location(store: str | None, password_file: Path | None, state_db: Path) -> StoreLocation:
    """What ``store``, ``store_password_file`` and ``state_db`` name together;
    ConfigError naming the key when they do not fit."""
    if store is None:
        location: StoreLocation = SqliteLocation(path=state_db)
    else:
        try:
            location = parse_store_url(store)
        except ValueError as exc:
            raise ConfigError(f"store: {exc}") from None
    if isinstance(location, SqliteLocation):
        if password_file is not None:
            raise ConfigError("store_password_file: only a postgresql:// store takes a password")
        return location
    if password_file is not None and not password_file.is_absolute():
        raise ConfigError(f"store_password_file: must be an absolute path, got {password_file}")
    return location.model_copy(update={"password_file": password_file})
