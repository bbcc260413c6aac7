"""docs/operations.md: the metrics reference table says what the code declares."""

from __future__ import annotations

import re
from pathlib import Path

from ops_metrics import Declared, declared_metrics

DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
_ROW = re.compile(r"^\| `(hyperpod_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \| (\w+) \| [^|]+ \|$")

Row = tuple[str, str, frozenset[str], str]


def table_rows(text: str) -> list[Row]:
    """(name, type, labels, component) of every metrics-table row in a markdown text."""
    rows = []
    for line in text.splitlines():
        m = _ROW.match(line.strip())
        if m:
            labels = frozenset(
                x.strip() for x in m.group(3).split(",") if x.strip() not in {"", "—"}
            )
            rows.append((m.group(1), m.group(2), labels, m.group(4)))
    return rows


def as_row(d: Declared) -> Row:
    return (d.query_name, d.type, d.labels, d.component)


def mismatches(rows: list[Row], declared: list[Declared]) -> tuple[set[Row], set[Row]]:
    """(rows the code does not declare, declared metrics the table lacks or gets wrong)."""
    want = {as_row(d) for d in declared}
    have = set(rows)
    return have - want, want - have


def test_table_parser() -> None:
    text = (
        "| `hyperpod_x_total` | counter | kind, outcome | controller | what |\n"
        "| `hyperpod_y` | gauge | — | agent | why |\n"
        "| not a row |\n"
    )
    assert table_rows(text) == [
        ("hyperpod_x_total", "counter", frozenset({"kind", "outcome"}), "controller"),
        ("hyperpod_y", "gauge", frozenset(), "agent"),
    ]


def test_a_wrong_row_is_caught() -> None:
    declared = [Declared("hyperpod_faults", "counter", frozenset({"code"}), "controller", "")]
    wrong = [("hyperpod_faults_total", "counter", frozenset({"node"}), "controller")]
    extra, missing = mismatches(wrong, declared)
    assert extra == set(wrong)
    assert missing == {("hyperpod_faults_total", "counter", frozenset({"code"}), "controller")}


def test_reference_table_matches_the_code() -> None:
    rows = table_rows(DOC.read_text())
    assert len(rows) == len({r[0] for r in rows}), "a metric is listed twice"
    extra, missing = mismatches(rows, declared_metrics())
    assert extra == set(), f"documented but not declared (or wrong type/labels): {extra}"
    assert missing == set(), f"declared but not documented: {missing}"
