"""Pure parsers for what Slurm prints: no I/O, tested on captured output of the real Slurm.

Primary sources are ``sinfo --json`` and ``squeue --json`` (OpenAPI v0.0.38 in Slurm 22.05);
``scontrol show node|job -o`` (``scontrol_text``) is parsed too, for single-object look-ups and
as a fallback, and re-exported here so callers need one import. Newer Slurm releases wrap
numbers as ``{"set": .., "number": ..}`` and states as lists; both shapes are accepted so an
upgrade does not break the reader.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from hyperpod_agent.errors import SlurmError, SlurmParseError
from hyperpod_agent.slurm._common import (
    FINISHED_STATES,
    INTEGER,
    NODE_BASE_STATES,
    NULLS,
    epoch,
    hostnames,
    parse_auto_resume,
    split_state,
)
from hyperpod_agent.slurm.hostlist import compress_hostlist, expand_hostlist
from hyperpod_agent.slurm.models import Job, Node
from hyperpod_agent.slurm.scontrol_text import (
    parse_kv_line,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
)

__all__ = [
    "FINISHED_STATES",
    "NODE_BASE_STATES",
    "compress_hostlist",
    "expand_hostlist",
    "parse_auto_resume",
    "parse_kv_line",
    "parse_scontrol_jobs",
    "parse_scontrol_nodes",
    "parse_sinfo_json",
    "parse_squeue_json",
    "split_state",
]

SINFO_ARGV = ["sinfo", "--json"]
SQUEUE_ARGV = ["squeue", "--json"]
_JSON_JOB_EXTRA = ("comment", "required_nodes", "array_job_id", "array_task_id", "account")


class _Fields:
    """Typed access to one JSON object: a missing or null key gives the default, a value of
    the wrong type raises SlurmParseError naming the object and the key."""

    def __init__(self, raw: Mapping[str, Any], argv: list[str], where: str) -> None:
        self.raw, self.argv, self.where = raw, argv, where

    def bad(self, key: str, expected: str) -> SlurmParseError:
        got = type(self.raw.get(key)).__name__
        return SlurmParseError(self.argv, f"{self.where}.{key} is {got}, expected {expected}")

    def text(self, key: str) -> str:
        value = self.raw.get(key)
        if value is None:
            return ""
        if isinstance(value, str):
            return value.strip()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise self.bad(key, "a string")

    def texts(self, key: str) -> tuple[str, ...]:
        value = self.raw.get(key)
        if value is None:
            return ()
        if isinstance(value, str):
            items: list[Any] = value.split(",")
        elif isinstance(value, list):
            items = value
        else:
            raise self.bad(key, "a list of strings")
        if not all(isinstance(v, str) for v in items):
            raise self.bad(key, "a list of strings")
        return tuple(v.strip() for v in items if v.strip())

    def int(self, key: str) -> int | None:
        """An integer; Slurm 23.02+ wraps numbers as ``{"set", "infinite", "number"}``."""
        value = self.raw.get(key)
        if isinstance(value, Mapping):
            if not value.get("set", True) or value.get("infinite", False):
                return None
            value = value.get("number")
        if value is None:
            return None
        if isinstance(value, bool):
            raise self.bad(key, "a number")
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return int(value) if math.isfinite(value) else None
        if isinstance(value, str) and INTEGER.fullmatch(value.strip()):
            return int(value)
        raise self.bad(key, "a number")

    def time(self, key: str) -> datetime | None:
        return epoch(self.int(key))

    def flag(self, key: str) -> bool:
        value = self.raw.get(key)
        if value is None:
            return False
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return value != 0
        raise self.bad(key, "a boolean")

    def words(self, key: str) -> list[str]:
        """A state: a string (``"MIXED+DRAIN"``) or, in 23.02+, a list of strings."""
        value = self.raw.get(key)
        if value is None:
            return []
        if isinstance(value, str):
            return value.split("+")
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise self.bad(key, "a string or a list of strings")


def _load(text: str, key: str, argv: list[str]) -> list[Mapping[str, Any]]:
    """Decode one ``--json`` document and return its ``key`` list, checking the shape."""
    if not text.strip():
        raise SlurmParseError(argv, "empty output, expected JSON")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(argv, f"not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise SlurmParseError(argv, "JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise SlurmParseError(argv, f"expected a JSON object, got {type(doc).__name__}")
    errors = doc.get("errors") or []
    if errors:
        # squeue exits 0 with an error list when slurmctld is unreachable: not data, a failure.
        first = errors[0] if isinstance(errors, list) else errors
        if isinstance(first, dict):
            parts = [str(first[k]).strip() for k in ("description", "error") if first.get(k)]
            what = " (".join(parts) + (")" if len(parts) > 1 else "")
        else:
            what = str(first).strip()
        raise SlurmError(argv, 0, "", f"Slurm reported an error: {what or 'unspecified'}")
    if key not in doc:
        raise SlurmParseError(argv, f"no {key!r} key in JSON (keys: {', '.join(sorted(doc))})")
    items = doc[key]
    if not isinstance(items, list):
        raise SlurmParseError(argv, f"{key!r} is {type(items).__name__}, expected a list")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise SlurmParseError(argv, f"{key}[{i}] is {type(item).__name__}, expected an object")
    return items


# --- sinfo --json ----------------------------------------------------------------------------


def _node_from_json(raw: Mapping[str, Any], argv: list[str], index: int) -> Node:
    f = _Fields(raw, argv, f"nodes[{index}]")
    name = f.text("name")
    if not name:
        raise SlurmParseError(argv, f"nodes[{index}] has no name")
    f.where = f"node {name}"
    base, flags = split_state(f.words("state"))
    flags |= frozenset(w.upper() for w in f.texts("state_flags"))
    return Node(
        name=name,
        state=base,
        flags=flags,
        reason=f.text("reason"),
        reason_user=f.text("reason_set_by_user"),
        reason_time=f.time("reason_changed_at"),
        partitions=f.texts("partitions"),
        address=f.text("address"),
        port=f.int("port") or None,
        boot_time=f.time("boot_time"),
        slurmd_start_time=f.time("slurmd_start_time"),
    )


def parse_sinfo_json(text: str, argv: Sequence[str] = SINFO_ARGV) -> list[Node]:
    """``sinfo --json`` -> nodes, one per name, partitions merged, in Slurm's order."""
    argv = list(argv)
    merged: dict[str, Node] = {}
    for i, raw in enumerate(_load(text, "nodes", argv)):
        node = _node_from_json(raw, argv, i)
        seen = merged.get(node.name)
        if seen is None:
            merged[node.name] = node
            continue
        # A node in several partitions may be listed once per partition: keep one, union them.
        extra = tuple(p for p in node.partitions if p not in seen.partitions)
        merged[node.name] = replace(seen, partitions=seen.partitions + extra)
    return list(merged.values())


# --- squeue --json ---------------------------------------------------------------------------


def _exit_status(f: _Fields) -> tuple[int | None, int]:
    """Slurm's exit code -> (exit status, signal). 22.05 gives a raw wait status (768 = exit 3,
    15 = killed by SIGTERM); 23.02+ gives ``{"return_code": .., "signal": {"id": ..}}``."""
    value = f.raw.get("exit_code")
    if isinstance(value, Mapping) and ("return_code" in value or "signal" in value):
        inner = _Fields(value, f.argv, f"{f.where}.exit_code")
        code = inner.int("return_code")
        sig = value.get("signal")
        signal = _Fields(sig, f.argv, inner.where).int("id") if isinstance(sig, Mapping) else None
        return code, signal or 0
    raw = f.int("exit_code")
    if raw is None or raw < 0:
        return None, 0
    return (raw >> 8) & 0xFF, raw & 0x7F


def _job_from_json(raw: Mapping[str, Any], argv: list[str], index: int) -> Job:
    f = _Fields(raw, argv, f"jobs[{index}]")
    job_id = f.int("job_id")
    if job_id is None:
        raise SlurmParseError(argv, f"jobs[{index}] has no job_id")
    f.where = f"job {job_id}"
    words = f.words("job_state")
    state = words[0].strip().upper() if words else ""
    if not state:
        raise SlurmParseError(argv, f"job {job_id} has no job_state")
    finished = state in FINISHED_STATES
    exit_code, signal = _exit_status(f)
    admin_comment = f.text("admin_comment")
    reason = f.text("state_reason")
    extra = {k: f.text(k) for k in _JSON_JOB_EXTRA if f.text(k) not in ("", "0")}
    if signal:
        extra["exit_signal"] = str(signal)
    return Job(
        job_id=job_id,
        name=f.text("name"),
        state=state,
        state_reason="" if reason in NULLS else reason,
        nodes=hostnames(f.text("nodes"), argv),
        restart_count=f.int("restart_cnt") or 0,
        auto_resume=parse_auto_resume(admin_comment),
        admin_comment=admin_comment,
        exit_code=exit_code if finished else None,
        requeue=f.flag("requeue"),
        batch_host=f.text("batch_host"),
        user=f.text("user_name"),
        uid=f.int("user_id"),
        partition=f.text("partition"),
        # A pending job's times are estimates and a running job's end time is its time limit.
        start_time=f.time("start_time") if state != "PENDING" else None,
        end_time=f.time("end_time") if finished else None,
        extra=extra,
    )


def parse_squeue_json(text: str, argv: Sequence[str] = SQUEUE_ARGV) -> list[Job]:
    """``squeue --json`` -> jobs, in Slurm's order (22.05 lists every job slurmctld still
    holds, finished ones included, whatever filters are given)."""
    argv = list(argv)
    return [_job_from_json(raw, argv, i) for i, raw in enumerate(_load(text, "jobs", argv))]
