"""Helpers shared by the JSON and the text parsers of Slurm output. Pure, no I/O."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime

from hyperpod_agent.errors import SlurmError, SlurmParseError
from hyperpod_agent.slurm.hostlist import expand_hostlist

# Job states after which the job no longer runs; exit codes and end times mean something.
FINISHED_STATES = frozenset(
    "COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL PREEMPTED BOOT_FAIL DEADLINE OUT_OF_MEMORY "
    "SPECIAL_EXIT REVOKED".split()
)
# Base node states; anything else in a state word is a flag (DRAIN, NOT_RESPONDING, ...).
NODE_BASE_STATES = frozenset("IDLE MIXED ALLOCATED DOWN ERROR FUTURE UNKNOWN".split())
INTEGER = re.compile(r"-?[0-9]+")
NULLS = frozenset({"", "(null)", "None", "N/A", "Unknown", "n/a"})
AUTO_RESUME = re.compile(r"(?:^|[\s,;])auto_resume=([0-9]+)(?=$|[\s,;])")


def epoch(seconds: int | None) -> datetime | None:
    """Epoch seconds -> aware UTC datetime; 0 (Slurm's "not set") -> None."""
    if not seconds or seconds < 0:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def number(value: str | None) -> int | None:
    """An integer from Slurm text (``"12"``); None for anything else."""
    if isinstance(value, str) and INTEGER.fullmatch(value.strip()):
        return int(value)
    return None


def iso(value: str) -> datetime | None:
    """scontrol's ``2026-11-22T06:39:34`` (local time of the host) -> aware UTC datetime."""
    value = value.strip()
    if value in NULLS:
        return None
    try:
        return datetime.fromisoformat(value).astimezone(UTC)
    except (ValueError, OverflowError, OSError):
        return None


def hostnames(expr: str, argv: list[str]) -> tuple[str, ...]:
    try:
        return tuple(expand_hostlist(expr))
    except SlurmParseError as exc:
        raise SlurmParseError(argv, f"bad node list {expr!r}: {exc.stderr or exc}") from None


def split_state(state: str | Sequence[str] | None) -> tuple[str, frozenset[str]]:
    """A node state as Slurm prints it -> (base state, flags).

    Accepts ``"idle"`` with separate flags, ``"MIXED+DRAIN+REBOOT_REQUESTED"`` (scontrol),
    ``"down*"`` (sinfo text) and ``["IDLE", "DRAIN"]`` (Slurm 23.02+ JSON).
    """
    raw = (state or "").split("+") if isinstance(state, str) or state is None else state
    words = [w.strip().upper().rstrip("*~#!%$@^-") for w in raw if w and w.strip()]
    words = [w for w in words if w]
    if not words:
        return "UNKNOWN", frozenset()
    base = next((w for w in words if w in NODE_BASE_STATES), words[0])
    return base, frozenset(w for w in words if w != base)


def parse_auto_resume(admin_comment: str) -> int | None:
    """``auto_resume=N`` anywhere in a job's admin comment -> N; None when absent."""
    m = AUTO_RESUME.search(admin_comment or "")
    return int(m.group(1)) if m else None


def usage_error(argv: Sequence[str], message: str) -> SlurmError:
    """A call refused before any command ran (bad argument)."""
    return SlurmError(list(argv), None, "", message)


def check_job(job_id: int) -> str:
    """A job id as Slurm takes it; SlurmError for a bool, a non-int or a non-positive id."""
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
        raise usage_error(["scontrol"], f"invalid job id {job_id!r}")
    return str(job_id)
