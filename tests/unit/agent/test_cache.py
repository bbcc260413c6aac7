"""The health cache: atomic writes, read-back."""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hyperpod_agent.agent.cache import read_cache_dict, read_report, write_report
from hyperpod_agent.health import NodeReport, Verdict


def report(seq: int, message: str = "") -> NodeReport:
    return NodeReport(
        node="node1",
        agent_id="a1",
        seq=seq,
        generated_at=datetime.now(UTC),
        verdict=Verdict.HEALTHY,
        message=message,
    )


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run" / "health.json"
    write_report(path, report(7))
    assert read_report(path).seq == 7
    assert read_cache_dict(path)["verdict"] == "healthy"
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_no_temp_files_left(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    for i in range(5):
        write_report(path, report(i))
    assert [p.name for p in tmp_path.iterdir()] == ["health.json"]


def test_failed_write_keeps_old_file_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "health.json"
    write_report(path, report(1))

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_report(path, report(2))
    assert read_report(path).seq == 1
    assert [p.name for p in tmp_path.iterdir()] == ["health.json"]


def test_readers_never_see_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    write_report(path, report(0, "x" * 1000))
    stop = threading.Event()
    errors: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                json.loads(path.read_text())
            except ValueError as exc:
                errors.append(str(exc))

    t = threading.Thread(target=reader)
    t.start()
    for i in range(200):
        write_report(path, report(i, "y" * (i % 1000)))
    stop.set()
    t.join()
    assert errors == []


def test_read_cache_dict_rejects_non_object(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError):
        read_cache_dict(path)


def test_missing_cache_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_cache_dict(tmp_path / "none.json")
    assert not os.path.exists(tmp_path / "none.json")
