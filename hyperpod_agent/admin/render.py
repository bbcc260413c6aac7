"""Pure text rendering of controller answers for humans (tables, details)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

Column = tuple[str, Callable[[dict[str, Any]], Any]]

_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: datetime) -> datetime:
    """``10m``/``2h``/``3d`` before ``now``, or an ISO 8601 time (UTC if no zone)."""
    match = _DURATION.match(text)
    if match:
        return now - timedelta(seconds=int(match.group(1)) * _UNIT_S[match.group(2)])
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (30s, 10m, 2h, 1d, 1w) nor an ISO 8601 time"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def timestamp(value: Any) -> str:
    """An ISO time from the API as ``YYYY-MM-DD HH:MM:SS`` UTC; ``-`` when absent."""
    when = _parse_time(value)
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if when else "-"


def age(value: Any, now: datetime) -> str:
    """How long ago an ISO time was: ``42s``, ``5m``, ``3h``, ``2d``; ``-`` when absent."""
    when = _parse_time(value)
    if when is None:
        return "-"
    seconds = max(0, int((now - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def cell(value: Any) -> str:
    """One table cell: ``-`` for nothing, lists joined, no line breaks."""
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return " ".join(str(value).split())


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """Left-aligned columns under upper-case headers; the last column is not padded."""
    cells = [[h for h, _ in columns]] + [[cell(get(r)) for _, get in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = []
    for line in cells:
        padded = [text.ljust(widths[i]) for i, text in enumerate(line[:-1])] + [line[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``key: value`` lines with aligned values."""
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k + ':':<{width + 1}} {cell(v)}" for k, v in pairs)


def _node_state(n: dict[str, Any]) -> str:
    # Slurm's state may already carry its flags (IDLE+DRAIN); add only missing ones.
    parts = str(n.get("state") or "-").split("+")
    known = {p.upper() for p in parts}
    for flag in n.get("flags") or []:
        if str(flag).upper() not in known:
            parts.append(str(flag))
            known.add(str(flag).upper())
    return "+".join(parts)


def nodes_table(nodes: Sequence[dict[str, Any]], now: datetime) -> str:
    """``hyperpod nodes``."""
    return table(
        nodes,
        [
            ("NODE", lambda n: n.get("name")),
            ("STATE", _node_state),
            ("VERDICT", lambda n: n.get("verdict")),
            ("FAULTS", lambda n: n.get("open_faults")),
            ("REPORT", lambda n: age(n.get("last_report_at"), now)),
            ("HEARTBEAT", lambda n: age(n.get("last_heartbeat_at"), now)),
            ("REASON", lambda n: n.get("reason")),
        ],
    )


def status_text(s: dict[str, Any], now: datetime) -> str:
    """``hyperpod status``."""

    def counts(value: Any) -> str:
        if not isinstance(value, dict) or not value:
            return "-"
        return " ".join(f"{k}={v}" for k, v in sorted(value.items()))

    incident = "no"
    if s.get("incident_mode"):
        incident = f"YES: {s.get('incident_reason') or 'no reason given'}"
    last = s.get("last_pass_at")
    leading = []
    if s.get("role") not in (None, "single"):
        since = s.get("leader_since")
        who = s.get("leader") or "none (no controller holds the lease)"
        when = f" since {timestamp(since)} ({age(since, now)} ago)" if since else ""
        leading = [("leader", who + when)]
    text = fields(
        [
            ("nodes", s.get("nodes_total")),
            ("by state", counts(s.get("by_state"))),
            ("by verdict", counts(s.get("by_verdict"))),
            ("open faults", s.get("open_faults")),
            ("pending actions", s.get("pending_actions")),
            ("incident mode", incident),
            ("mode", s.get("mode") or ("observe" if s.get("dry_run") else "act")),
            ("last pass", f"{timestamp(last)} ({age(last, now)} ago)" if last else "never"),
            *leading,
            *_slurmctld(s),
            *_degraded(s.get("degraded")),
        ]
    )
    controllers = s.get("controllers")
    if not isinstance(controllers, list) or not controllers:
        return text
    return text + "\n\n" + _controllers_table(controllers)


def _slurmctld(s: dict[str, Any]) -> list[tuple[str, Any]]:
    """slurmctld's version, and whether a step retry may merge a spare into a job there
    (an older controller says neither)."""
    if "expansion_refused" not in s:
        return []
    refused = s.get("expansion_refused") or ""
    retry = f"requeued instead ({refused})" if refused else "in place"
    return [("slurmctld", s.get("slurmctld_version") or "unknown"), ("step retry", retry)]


def _degraded(items: Any) -> list[tuple[str, Any]]:
    """The items every pass skips, since they kept failing (see ``hyperpod events``)."""
    if not isinstance(items, list) or not items:
        return []
    shown = ", ".join(str(i) for i in items[:5]) + (
        f" (+{len(items) - 5} more)" if len(items) > 5 else ""
    )
    return [("DEGRADED", f"{len(items)} item(s) skipped every pass: {shown}")]


def _controllers_table(rows: Sequence[dict[str, Any]]) -> str:
    return table(
        rows,
        [
            ("CONTROLLER", lambda c: c.get("controller")),
            ("URL", lambda c: c.get("url")),
            ("ROLE", lambda c: c.get("role")),
            ("HEALTH", lambda c: "ok" if c.get("ok") else c.get("error") or "not ok"),
        ],
    )


def faults_table(faults: Sequence[dict[str, Any]]) -> str:
    return table(
        faults,
        [
            ("COMPONENT", lambda f: f.get("component")),
            ("CODE", lambda f: f.get("code")),
            ("SEVERITY", lambda f: f.get("severity")),
            ("ACTION", lambda f: f.get("action")),
            ("URGENT", lambda f: f.get("urgent")),
            ("COUNT", lambda f: f.get("count")),
            ("LAST SEEN", lambda f: timestamp(f.get("last_seen"))),
            ("CLOSED", lambda f: timestamp(f.get("closed_at"))),
            ("MESSAGE", lambda f: f.get("message")),
        ],
    )


def actions_table(actions: Sequence[dict[str, Any]]) -> str:
    return table(
        actions,
        [
            ("ID", lambda a: a.get("id")),
            ("KIND", lambda a: a.get("kind")),
            ("NODE", lambda a: a.get("node")),
            ("JOB", lambda a: a.get("job_id")),
            ("STATE", lambda a: a.get("state")),
            ("UPDATED", lambda a: timestamp(a.get("updated_at"))),
            ("REASON", lambda a: a.get("reason") or a.get("cause")),
        ],
    )


def events_table(events: Sequence[dict[str, Any]]) -> str:
    """``hyperpod events``."""
    return table(
        events,
        [
            ("TIME", lambda e: timestamp(e.get("at"))),
            ("KIND", lambda e: e.get("kind")),
            ("NODE", lambda e: e.get("node")),
            ("JOB", lambda e: e.get("job_id")),
            ("CAUSE", lambda e: e.get("cause")),
            ("MESSAGE", lambda e: e.get("message")),
        ],
    )


def node_detail(n: dict[str, Any], now: datetime) -> str:
    """``hyperpod node show``."""
    parts = [
        fields(
            [
                ("node", n.get("name")),
                ("state", _node_state(n)),
                ("reason", n.get("reason")),
                ("partitions", n.get("partitions")),
                ("verdict", n.get("verdict")),
                ("agent", n.get("agent_id")),
                ("last report", f"{timestamp(n.get('last_report_at'))}"),
                ("last heartbeat", f"{timestamp(n.get('last_heartbeat_at'))}"),
                ("open faults", n.get("open_faults")),
            ]
        )
    ]
    if n.get("faults"):
        parts.append("Faults:\n" + faults_table(n["faults"]))
    if n.get("findings"):
        parts.append("Hangs and stragglers:\n" + findings_table(n["findings"]))
    if n.get("deep_checks"):
        parts.append("Deep checks:\n" + outcomes_table(n["deep_checks"], with_node=False))
    if n.get("actions"):
        parts.append("Actions:\n" + actions_table(n["actions"]))
    return "\n\n".join(parts)


def outcomes_table(outcomes: Sequence[dict[str, Any]], with_node: bool = True) -> str:
    """Deep-check outcomes, one row a node and run."""
    columns: list[Column] = [
        ("AT", lambda o: timestamp(o.get("at"))),
        ("RUN", lambda o: o.get("run_id")),
        ("PURPOSE", lambda o: o.get("purpose")),
        ("OUTCOME", lambda o: o.get("outcome")),
        ("CHECK", lambda o: o.get("check") or "-"),
        ("CAUSE", lambda o: o.get("cause")),
    ]
    if with_node:
        columns.insert(1, ("NODE", lambda o: o.get("node")))
    return table(outcomes, columns)


def check_run(run: dict[str, Any]) -> str:
    """One deep-check run: its phase, then each node's checks."""
    head = (
        f"deep check run {run.get('id')} ({run.get('purpose')}, {run.get('level')}) on "
        f"{','.join(run.get('nodes') or [])}: {run.get('phase')}"
    )
    if run.get("job_id"):
        head += f", job {run['job_id']}"
    if run.get("error"):
        head += f"\n  error: {run['error']}"
    rows = [
        {"node": o.get("node"), **r}
        for o in run.get("outcomes") or []
        for r in (
            o.get("results")
            or [{"check": "-", "outcome": o.get("outcome"), "cause": o.get("cause")}]
        )
    ]
    if not rows:
        return head
    body = table(
        rows,
        [
            ("NODE", lambda r: r.get("node")),
            ("CHECK", lambda r: r.get("check")),
            ("OUTCOME", lambda r: r.get("outcome")),
            (
                "SECONDS",
                lambda r: (
                    f"{r['duration_s']:.1f}"
                    if isinstance(r.get("duration_s"), int | float)
                    else "-"
                ),
            ),
            ("CAUSE", lambda r: r.get("cause")),
        ],
    )
    verdicts = ", ".join(f"{o.get('node')} {o.get('outcome')}" for o in run.get("outcomes") or [])
    return f"{head}\n{body}\n{verdicts}"


def findings_table(findings: Sequence[dict[str, Any]]) -> str:
    return table(
        findings,
        [
            ("AT", lambda f: timestamp(f.get("at"))),
            ("KIND", lambda f: f.get("kind")),
            ("JOB", lambda f: f.get("job_id")),
            ("NODE", lambda f: f.get("node") or "-"),
            ("DETAIL", lambda f: f.get("detail")),
        ],
    )


def _findings_short(j: dict[str, Any]) -> str:
    """``hang@50 straggler:node2``: what the controller found, newest first."""
    out = []
    for f in j.get("findings") or []:
        if f.get("kind") == "hang":
            out.append(f"hang@{f.get('step')}")
        else:
            out.append(f"{f.get('kind')}:{f.get('node')}")
    return " ".join(out) or "-"


def jobs_table(jobs: Sequence[dict[str, Any]]) -> str:
    """``hyperpod jobs``."""
    return table(
        jobs,
        [
            ("JOB", lambda j: j.get("job_id")),
            ("STATE", lambda j: j.get("state")),
            ("NODES", lambda j: j.get("nodes")),
            ("RESTARTS", lambda j: j.get("restart_count")),
            ("RESUMES", lambda j: f"{j.get('attempts', 0)}/{j.get('cap', '-')}"),
            ("TRACKING", lambda j: j.get("tracking")),
            ("FROM STEP", lambda j: j.get("resumed_from_step")),
            ("STEP RETRIES", _step_retries_short),
            ("FOUND", _findings_short),
            ("LAST CAUSE", lambda j: j.get("last_cause")),
        ],
    )


def _step_retries_short(j: dict[str, Any]) -> str:
    last = j.get("last_step_retry")
    if not isinstance(last, dict):
        return "-"
    return f"{j.get('step_retries', 0)} ({last.get('phase')})"


def _step_retries_table(j: dict[str, Any]) -> str:
    return table(
        j["step_retry_history"],
        [
            ("ID", lambda r: r.get("id")),
            ("STEP", lambda r: r.get("step_id")),
            ("ATTEMPT", lambda r: r.get("attempt")),
            ("DECISION", lambda r: r.get("decision")),
            ("PHASE", lambda r: r.get("phase")),
            ("NODES", lambda r: r.get("nodelist") or "-"),
            ("AT", lambda r: timestamp(r.get("created_at"))),
            ("CAUSE", lambda r: r.get("cause")),
        ],
    )


def job_detail(j: dict[str, Any]) -> str:
    """``hyperpod jobs show``."""
    parts = [
        fields(
            [
                ("job", j.get("job_id")),
                ("state", j.get("state")),
                ("nodes", j.get("nodes")),
                ("restart count", j.get("restart_count")),
                ("auto-resume", f"{j.get('attempts', 0)} of {j.get('cap', '-')} used"),
                ("tracking", j.get("tracking")),
                ("last cause", j.get("last_cause")),
                ("last requeue", timestamp(j.get("last_requeue_at"))),
                ("resumed from step", j.get("resumed_from_step")),
            ]
        )
    ]
    if j.get("step_retry_history"):
        parts.append("Step retries (in place, newest first):\n" + _step_retries_table(j))
    if j.get("findings"):
        parts.append("Hangs and stragglers:\n" + findings_table(j["findings"]))
    if j.get("events"):
        parts.append("Events:\n" + events_table(j["events"]))
    if j.get("actions"):
        parts.append("Actions:\n" + actions_table(j["actions"]))
    return "\n\n".join(parts)
