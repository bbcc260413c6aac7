"""The StepFun InfiniteHBD fault trace: read it, pair its events into fault intervals.

400 GPU servers of an LLM pre-training cluster over 348 days (upstream README); only the
231 servers with a fault appear in the file, so the others are added as empty histories.
Reading (``read_trace``) is separate from parsing (``parse_trace``, pure).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperpod_agent.simulate.causes import FaultClass, trace_class
from hyperpod_agent.simulate.inputs import read_json

# The trace as its authors describe it (UPSTREAM-README.md): servers observed, days.
TRACE_SERVERS = 400
TRACE_DAYS = 348.0
TRACE_DIR = Path("data") / "stepfun-fault-trace"
TRACE_FILE = "fault_trace.json"


class TraceError(ValueError):
    """A trace file that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Interval:
    """One fault of one server: when it started (days), how long it lasted (days)."""

    start_d: float
    duration_d: float
    cls: FaultClass
    cause: str  # the trace's "Class: Desc"


@dataclass(frozen=True)
class Trace:
    """Per-server fault histories, faultless servers included (empty)."""

    histories: tuple[tuple[Interval, ...], ...]
    days: float

    @property
    def faults(self) -> int:
        return sum(len(h) for h in self.histories)

    @property
    def rate_per_1000_node_days(self) -> float:
        return 1000.0 * self.faults / (len(self.histories) * self.days)


def default_trace_path() -> Path:
    """The vendored trace, found from the repository root (this file's grandparents)."""
    return Path(__file__).resolve().parents[2] / TRACE_DIR / TRACE_FILE


def parse_trace(
    events: Any, servers: int = TRACE_SERVERS, days: float = TRACE_DAYS, origin: str = "trace"
) -> Trace:
    """Pair each server's ``fault_start`` with the next ``fault_end`` of the same fault
    type; a fault never ended lasts to the end of the trace."""
    if not isinstance(events, list):
        raise TraceError(f"{origin}: expected a JSON list of events")
    open_: dict[tuple[str, str], list[tuple[float, dict[str, Any]]]] = defaultdict(list)
    by_node: dict[str, list[Interval]] = defaultdict(list)
    for i, ev in enumerate(events):
        try:
            node, t, kind, ftype = (
                ev["node_id"],
                float(ev["event_time"]),
                ev["event_type"],
                ev["fault_type"],
            )
            key = (node, json.dumps(ftype, sort_keys=True))
        except (KeyError, TypeError, ValueError):
            raise TraceError(
                f"{origin}: event {i}: expected node_id, event_time, event_type, fault_type"
            ) from None
        if kind == "fault_start":
            open_[key].append((t, ftype))
        elif kind == "fault_end":
            if open_[key]:
                start, ft = open_[key].pop(0)
                by_node[node].append(_interval(start, t - start, ft))
        else:
            raise TraceError(f"{origin}: event {i}: unknown event_type {kind!r}")
    for (node, _), starts in open_.items():
        for start, ft in starts:
            by_node[node].append(_interval(start, max(0.0, days - start), ft))
    if len(by_node) > servers:
        raise TraceError(f"{origin}: {len(by_node)} servers with faults, more than {servers}")
    histories = [tuple(sorted(h, key=lambda iv: iv.start_d)) for _, h in sorted(by_node.items())]
    histories += [()] * (servers - len(histories))
    return Trace(tuple(histories), days)


def _interval(start: float, duration: float, ftype: dict[str, Any]) -> Interval:
    cls, desc = str(ftype.get("Class", "")), str(ftype.get("Desc", ""))
    return Interval(start, max(0.0, duration), trace_class(cls, desc), f"{cls}: {desc}")


def read_trace(path: Path | None = None) -> Trace:
    """Read and parse the trace file at ``path`` (the vendored one by default)."""
    path = path or default_trace_path()
    return parse_trace(read_json(path, TraceError), origin=str(path))


def durations_days(trace: Trace) -> Sequence[float]:
    """Every fault's time out of service, in days (for the repair distribution)."""
    return sorted(iv.duration_d for h in trace.histories for iv in h)
