"""Pure rendering: durations, ages, tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hyperpod_agent.admin import render

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", NOW - timedelta(seconds=30)),
        ("10m", NOW - timedelta(minutes=10)),
        (" 2h ", NOW - timedelta(hours=2)),
        ("1d", NOW - timedelta(days=1)),
        ("1w", NOW - timedelta(weeks=1)),
        ("2026-11-22T10:00:00", datetime(2026, 11, 22, 10, tzinfo=UTC)),
        ("2026-11-22T10:00:00+02:00", datetime(2026, 11, 22, 8, tzinfo=UTC)),
        ("2026-11-22", datetime(2026, 11, 22, tzinfo=UTC)),
    ],
)
def test_parse_since(text: str, expected: datetime) -> None:
    assert render.parse_since(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday-ish", "10", "10 minutes", "-5m", ""])
def test_parse_since_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="is neither a duration"):
        render.parse_since(text, NOW)


@pytest.mark.parametrize(
    ("delta", "expected"),
    [(5, "5s"), (59, "59s"), (60, "1m"), (3599, "59m"), (7200, "2h"), (200000, "2d"), (-3, "0s")],
)
def test_age(delta: int, expected: str) -> None:
    assert render.age((NOW - timedelta(seconds=delta)).isoformat(), NOW) == expected


@pytest.mark.parametrize("value", [None, "", "not a time", 5])
def test_age_and_timestamp_of_nothing(value: object) -> None:
    assert render.age(value, NOW) == "-"
    assert render.timestamp(value) == "-"


def test_timestamp_in_utc() -> None:
    assert render.timestamp("2026-11-22T14:00:00+02:00") == "2026-11-22 12:00:00"


def test_table_aligns_and_fills_blanks() -> None:
    rows = [{"a": "x", "b": None, "c": ["p", "q"]}, {"a": "longer", "b": True, "c": "multi\nline"}]
    text = render.table(
        rows, [("A", lambda r: r["a"]), ("B", lambda r: r["b"]), ("C", lambda r: r["c"])]
    )
    assert text.splitlines() == [
        "A       B    C",
        "x       -    p,q",
        "longer  yes  multi line",
    ]


def test_table_with_no_rows_has_a_header() -> None:
    assert render.table([], [("NODE", lambda r: r)]) == "NODE"


def test_fields_align() -> None:
    assert render.fields([("a", 1), ("long key", None)]) == "a:        1\nlong key: -"


@pytest.mark.parametrize(
    ("state", "flags", "expected"),
    [
        ("IDLE+DRAIN", ["DRAIN"], "IDLE+DRAIN"),
        ("idle", ["DRAIN"], "idle+DRAIN"),
        ("MIXED", ["DRAIN", "NOT_RESPONDING"], "MIXED+DRAIN+NOT_RESPONDING"),
        (None, [], "-"),
    ],
)
def test_node_state_adds_only_missing_flags(
    state: str | None, flags: list[str], expected: str
) -> None:
    text = render.nodes_table([{"name": "n", "state": state, "flags": flags}], NOW)
    assert text.splitlines()[1].split()[1] == expected


def test_closed_faults_say_when() -> None:
    fault = {"component": "gpu0", "code": "xid79", "closed_at": "2026-11-22T11:00:00+00:00"}
    assert "2026-11-22 11:00:00" in render.faults_table([fault])
