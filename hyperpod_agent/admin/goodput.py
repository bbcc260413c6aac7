"""Text of the goodput answers for humans (``hyperpod goodput``, ``hyperpod jobs show``):
what a time is known as, at least, or not known."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hyperpod_agent.admin.render import fields, table, timestamp


def duration(seconds: Any) -> str:
    """``42.0s``, ``16m40s``, ``2h05m``, ``3d04h``; ``unknown`` when not a number."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "unknown"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}{(whole % size) // sub_size:02d}{sub}"
    return f"{whole // 60}m{whole % 60:02d}s"


def lost(value: Any) -> str:
    """One cause's time: ``12.0s``; ``>=12.0s`` when more may be missing; ``unknown``."""
    if not isinstance(value, Mapping) or value.get("seconds") is None:
        return "unknown"
    text = duration(value["seconds"])
    return text if value.get("complete", True) else f">={text}"


def ratio(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else "-"


def _lost_table(rows: Mapping[str, Any]) -> str:
    """A line per cause, in the controller's order (the order of a recovery)."""
    return table(
        [{"cause": c, **dict(v)} for c, v in rows.items() if isinstance(v, Mapping)],
        [
            ("CAUSE", lambda r: r["cause"]),
            ("LOST", lost),
            ("NOTE", lambda r: r.get("why")),
        ],
    )


def _window(doc: Mapping[str, Any], start: str, end: str) -> str:
    since = timestamp(doc.get(start)) if doc.get(start) else "the oldest record"
    return f"{since} to {timestamp(doc.get(end))} UTC"


def _limits(doc: Mapping[str, Any]) -> list[str]:
    items = doc.get("limits") or []
    return ["Limits:\n" + "\n".join(f"  - {item}" for item in items)] if items else []


def _phase(name: str) -> Any:
    return lambda i: lost(i["phases"][name]) if name in (i.get("phases") or {}) else "-"


def incidents_table(incidents: list[dict[str, Any]], causes: list[str]) -> str:
    """A line per recovery; a column per cause of ``causes`` any of them went through."""
    shown = [c for c in causes if any(c in (i.get("phases") or {}) for i in incidents)]
    return table(
        incidents,
        [
            ("STARTED", lambda i: timestamp(i.get("started_at"))),
            ("PATH", lambda i: i.get("path")),
            ("NODE", lambda i: i.get("node")),
            *[(c.upper().replace("_", " "), _phase(c)) for c in shown],
            ("STEPS AGAIN", lambda i: i.get("recomputed_steps")),
            (
                "CAUSE",
                lambda i: f"{i.get('cause') or '-'}{' (under way)' if i.get('ongoing') else ''}",
            ),
        ],
    )


def job_text(doc: Mapping[str, Any]) -> str:
    """One job's goodput (``hyperpod goodput --job``; the block of ``jobs show``)."""
    parts = [
        fields(
            [
                ("job", doc.get("job_id")),
                ("state", doc.get("state") or "not in Slurm's view"),
                ("nodes", doc.get("nodes")),
                ("window", _window(doc, "start", "end") if doc.get("end") else "-"),
                ("wall", duration(doc.get("wall_s"))),
                ("productive", duration(doc.get("productive_s"))),
                ("ETTR", ratio(doc.get("ettr"))),
                ("unaccounted", duration(doc.get("unaccounted_s"))),
            ]
        ),
        _lost_table(doc.get("lost") or {}),
    ]
    if doc.get("incidents"):
        causes = list(doc.get("lost") or {})
        parts.append("Incidents:\n" + incidents_table(list(doc["incidents"]), causes))
    return "\n\n".join(parts + _limits(doc))


def _most_lost(job: Mapping[str, Any]) -> str:
    known = [
        (float(v["seconds"]), c)
        for c, v in (job.get("lost") or {}).items()
        if isinstance(v, Mapping) and isinstance(v.get("seconds"), int | float) and v["seconds"]
    ]
    if not known:
        return "-"
    seconds, cause = max(known)
    return f"{cause} {duration(seconds)}"


def cluster_text(doc: Mapping[str, Any]) -> str:
    """``hyperpod goodput``: the cluster's sum, then a line per job."""
    parts = [
        fields(
            [
                ("window", _window(doc, "since", "until")),
                ("jobs", doc.get("jobs_counted")),
                ("ETTR", f"{ratio(doc.get('ettr'))} (node time, each job weighted by its nodes)"),
                ("wall", f"{duration(doc.get('wall_node_s'))} node time"),
                ("productive", f"{duration(doc.get('productive_node_s'))} node time"),
                ("unaccounted", f"{duration(doc.get('unaccounted_node_s'))} node time"),
            ]
        ),
        "Lost (node time):\n" + _lost_table(doc.get("lost_node_s") or {}),
    ]
    jobs = [dict(j) for j in doc.get("jobs") or [] if isinstance(j, Mapping)]
    if jobs:
        rows = table(
            jobs,
            [
                ("JOB", lambda j: j.get("job_id")),
                ("STATE", lambda j: j.get("state") or "gone"),
                ("NODES", lambda j: j.get("nodes")),
                ("WALL", lambda j: duration(j.get("wall_s"))),
                ("PRODUCTIVE", lambda j: duration(j.get("productive_s"))),
                ("ETTR", lambda j: ratio(j.get("ettr"))),
                ("INCIDENTS", lambda j: len(j.get("incidents") or [])),
                ("UNACCOUNTED", lambda j: duration(j.get("unaccounted_s"))),
                ("MOST LOST", _most_lost),
            ],
        )
        parts.append("Jobs:\n" + rows)
    return "\n\n".join(parts + _limits(doc))
