"""The Grafana dashboard and the PromQL in it (shared by the ops tests)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana" / "hyperpod.json"
DS_VAR = "${datasource}"

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_METRIC = re.compile(r"(?<![A-Za-z0-9_:.$])hyperpod_[a-z0-9_]+(?![A-Za-z0-9_:])")


def metric_names(expr: str) -> set[str]:
    """Every ``hyperpod_*`` metric name in a PromQL expression.

    String literals are dropped first: a label value such as ``job="hyperpod_agent"`` is
    not a metric. Label names never start with ``hyperpod_`` in this project.
    """
    return set(_METRIC.findall(_STRING.sub('""', expr)))


def load() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def all_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def expressions(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    out: list[tuple[str, str]] = []
    for p in all_panels(dash):
        for t in p.get("targets", []):
            out.append((f"panel {p['id']} {p['title']!r}", t["expr"]))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]
            out.append((f"variable {v['name']}", q["query"] if isinstance(q, dict) else q))
    return out
