import os
import time
from pathlib import Path

from hyperpod_agent.agent.markers import MAX_MARKERS, MarkerReader, parse_marker


def test_parse_marker() -> None:
    assert parse_marker("auto_resume=3 step=0 node=node2\n") == (3, "node2")
    assert parse_marker("auto_resume=1") == (1, "")
    assert parse_marker("auto_resume=abc node=n") is None
    assert parse_marker("garbage") is None
    assert parse_marker("auto_resume=-1") is None
    assert parse_marker("") is None


def write(d: Path, name: str, text: str, age: float = 0.0) -> None:
    p = d / name
    p.write_text(text)
    if age:
        t = time.time() - age
        os.utime(p, (t, t))


def test_reader_keeps_this_nodes_markers_only(tmp_path: Path) -> None:
    write(tmp_path, "17", "auto_resume=2 step=0 node=node1\n")
    write(tmp_path, "18", "auto_resume=1 step=0 node=node2\n")
    write(tmp_path, "19", "not a marker")
    write(tmp_path, "notes.txt", "auto_resume=5 node=node1")
    assert MarkerReader(tmp_path, "node1").jobs() == {17: 2}


def test_reader_notices_new_markers_and_prunes_old_ones(tmp_path: Path) -> None:
    reader = MarkerReader(tmp_path, "node1", max_age_s=3600)
    assert reader.jobs() == {}
    write(tmp_path, "5", "auto_resume=1 node=node1", age=7200)
    write(tmp_path, "6", "auto_resume=4 node=node1")
    os.utime(tmp_path, (time.time() + 5, time.time() + 5))  # the directory changed
    assert reader.jobs() == {6: 4}
    assert not (tmp_path / "5").exists()


def test_reader_caps_and_survives_a_missing_directory(tmp_path: Path) -> None:
    assert MarkerReader(tmp_path / "missing", "n").jobs() == {}
    for i in range(MAX_MARKERS + 10):
        write(tmp_path, str(i), "auto_resume=1 node=n")
    assert len(MarkerReader(tmp_path, "n").jobs()) == MAX_MARKERS


def test_odd_names_and_values_are_skipped_not_fatal(tmp_path: Path) -> None:
    # "²".isdigit() is true and int("²") raises: such a name once failed every cycle.
    for name in ("²", "١٢", "0", "99999999999", "17\n"):
        try:
            write(tmp_path, name, "auto_resume=2 node=node1")
        except OSError:
            continue  # a name this filesystem refuses
    write(tmp_path, "21", "auto_resume=² node=node1")
    write(tmp_path, "22", "auto_resume=3 node=node1")
    assert MarkerReader(tmp_path, "node1").jobs() == {22: 3}
    assert parse_marker("auto_resume=٣") is None
