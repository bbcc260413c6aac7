"""What the store's tests share on both backends (fixtures are in conftest.py)."""

from __future__ import annotations

import os
import socket
import sqlite3
from pathlib import Path

import psycopg

from hyperpod_agent.controller.store.url import PostgresLocation, StoreLocation

PG_ROLE = "hyperpod"
PG_PASSWORD = "s3cret-for-tests"
# What a failed write raises on either backend.
INTEGRITY_ERRORS = (sqlite3.IntegrityError, psycopg.IntegrityError)

StoreTarget = Path | StoreLocation


def port_free(port: int) -> bool:
    """Whether nothing listens on ``port`` of loopback (others' checkouts may)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def target_argv(target: StoreTarget) -> list[str]:
    """The target as a child process's arguments: the URL and the password file."""
    if isinstance(target, PostgresLocation):
        return [target.url, str(target.password_file)]
    return [f"sqlite://{os.fspath(target)}", ""]


# A child process opening the store the arguments name (see target_argv).
OPEN_IN_CHILD = (
    "import sys\n"
    "from pathlib import Path\n"
    "from hyperpod_agent.controller.store.facade import Store\n"
    "from hyperpod_agent.controller.store.url import store_location\n"
    "s = Store(store_location(sys.argv[1], Path(sys.argv[2]) if sys.argv[2] else None, "
    "Path('/nonexistent')))\n"
)
