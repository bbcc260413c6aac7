"""``resume.json``: parsing (pure, table-driven) and the guarded read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hyperpod_agent.controller.resume_marker import (
    MAX_BYTES,
    MarkerError,
    ResumeMarker,
    marker_path,
    parse_marker,
    read_marker,
    stat_marker,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"job_id": 12, "restart_count": 1, "step": 1500, "at": "t"}', ResumeMarker(12, 1500, 1)),
        ('{"step": 0}', ResumeMarker(12, 0, None)),
        ('{"step": 7, "restart_count": null, "future": "field"}', ResumeMarker(12, 7, None)),
    ],
)
def test_parse_good_markers(text: str, expected: ResumeMarker) -> None:
    assert parse_marker(text, 12) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "not valid JSON"),
        ("{", "not valid JSON"),
        ("[1]", "expected a JSON object"),
        ('{"job_id": 13, "step": 1}', "job_id is 13, expected 12"),
        ("{}", "step: expected a non-negative integer, got None"),
        ('{"step": -1}', "step: expected a non-negative integer"),
        ('{"step": 1.5}', "step: expected a non-negative integer"),
        ('{"step": "100"}', "step: expected a non-negative integer"),
        ('{"step": true}', "step: expected a non-negative integer"),
        ('{"step": 1, "restart_count": "x"}', "restart_count: expected"),
        ('{"step": 1, "job_id": "12"}', "job_id: expected"),
        # A user writes this file: every number is bounded before it reaches the store.
        ('{"step": 9223372036854775808}', "step: expected an integer from 0 to 2\\*\\*53"),
        ('{"step": 1e400}', "step: expected a non-negative integer"),
        ('{"step": 1, "restart_count": 99999999999999999999}', "restart_count: expected"),
        ('{"step": 1, "job_id": 18446744073709551616}', "job_id: expected"),
    ],
)
def test_parse_bad_markers(text: str, why: str) -> None:
    with pytest.raises(MarkerError, match=why):
        parse_marker(text, 12)


def test_read_a_regular_file(tmp_path: Path) -> None:
    path = marker_path(tmp_path, 12)
    assert path == tmp_path / "12" / "resume.json"
    assert stat_marker(path) is None
    path.parent.mkdir()
    path.write_text('{"step": 3}')
    assert stat_marker(path) is not None
    assert read_marker(path) == '{"step": 3}'


def test_read_refuses_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_text('{"step": 1}')
    link = tmp_path / "resume.json"
    link.symlink_to(target)
    with pytest.raises(OSError):
        read_marker(link)


def test_read_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "resume.json"
    os.mkfifo(fifo)
    with pytest.raises(MarkerError, match="not a regular file"):
        read_marker(fifo)


def test_read_refuses_a_directory_and_a_huge_file(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises((OSError, MarkerError)):
        read_marker(tmp_path / "d")
    big = tmp_path / "big"
    big.write_bytes(b" " * (MAX_BYTES + 1))
    with pytest.raises(MarkerError, match="larger than"):
        read_marker(big)


def test_read_refuses_binary(tmp_path: Path) -> None:
    path = tmp_path / "bin"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(MarkerError, match="UTF-8"):
        read_marker(path)
