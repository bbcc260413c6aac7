"""The health cache: the agent's latest NodeReport as one JSON file.

Written atomically every cycle (temporary file in the same directory, fsync, rename,
fsync of the directory) so a reader sees the old report or the new one, never half of
one. ``health-check`` reads it with ``read_cache_dict`` using only the standard library:
slurmd runs that check often and it must start fast.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hyperpod_agent.health import NodeReport

DEFAULT_CACHE_PATH = Path("/run/hyperpod/health.json")


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_report(path: Path, report: NodeReport) -> None:
    """Write ``report`` to the cache at ``path``."""
    write_text_atomic(path, report.model_dump_json(indent=1) + "\n")


def read_cache_dict(path: Path) -> dict[str, Any]:
    """The cache as plain JSON. OSError if unreadable, ValueError if not a JSON object."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def read_report(path: Path) -> NodeReport:
    """The cache as a validated NodeReport (pydantic ValidationError if malformed)."""
    from hyperpod_agent.health import NodeReport

    return NodeReport.model_validate_json(path.read_bytes())
