"""The pure parts of reading progress records: /proc text and step-time summaries."""

from __future__ import annotations

import pytest

from hyperpod_agent.agent.progress_files import (
    job_id_of,
    parse_proc_stat,
    parse_proc_uids,
    rank_of,
    summarise,
)


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("1234 (python) S 1 1234 1234 0 -1 4194560 0 0", "S"),
        ("1234 (my (odd) name) R 1 2 3", "R"),
        ("1234 (a b) c) ) D 1 2 3", "D"),  # comm may hold spaces and ')'
        ("1234 (x) T 1", "T"),
        ("1234 (x) t 1", "t"),
        ("1234 (x) Z 1", "Z"),
        ("1234 (x)", ""),  # cut short
        ("garbage", ""),
        ("", ""),
    ],
)
def test_parse_proc_stat(text: str, state: str) -> None:
    assert parse_proc_stat(text) == state


def test_summary_of_known_durations() -> None:
    window, median, p95, last = summarise(tuple(float(d) for d in range(1, 101)))
    assert (window, median, p95, last) == (100, 50.5, 95.0, 100.0)
    assert summarise((2.0, 1.0, 3.0)) == (3, 2.0, 3.0, 3.0)
    assert summarise(()) == (0, None, None, None)


def test_summary_leaves_out_durations_no_clock_gives() -> None:
    window, median, _, last = summarise((1.0, float("nan"), -2.0, float("inf"), 3.0))
    assert (window, median, last) == (2, 2.0, 3.0)
    assert summarise((1.0, float("nan")))[3] is None  # the newest one is not usable
    nan = float("nan")
    assert summarise((5.0, nan, 1.0, nan, 3.0, 4.0, nan, 2.0)) == (5, 3.0, 5.0, 2.0)


@pytest.mark.parametrize(
    ("text", "uids"),
    [
        ("Name:\tpython\nUid:\t1000\t1001\t1000\t1000\nGid:\t5\t5\t5\t5\n", (1000, 1001)),
        ("Name:\tx\n", ()),
        ("Uid:\tabc\t1\n", ()),
    ],
)
def test_parse_proc_uids(text: str, uids: tuple[int, ...]) -> None:
    assert parse_proc_uids(text) == uids


@pytest.mark.parametrize(
    ("name", "job"),
    [
        ("42", 42),
        ("0", None),
        ("4294967295", 4294967295),
        ("4294967296", None),
        ("５０", None),
        ("4a", None),
        (" 4", None),
        ("", None),
        ("12345678901", None),
    ],
)
def test_job_names(name: str, job: int | None) -> None:
    assert job_id_of(name) == job


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("0.prog", 0),
        ("255.prog", 255),
        ("０.prog", None),
        ("1.prog.tmp", None),
        (".prog", None),
        ("-1.prog", None),
        ("1.PROG", None),
    ],
)
def test_rank_names(name: str, rank: int | None) -> None:
    assert rank_of(name) == rank
