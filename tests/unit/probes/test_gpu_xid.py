"""XID table and the kernel-log parser/reader, on literal lines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyperpod_agent.health import Action
from hyperpod_agent.probes.xid import (
    KmsgReader,
    KmsgXid,
    XidRule,
    normalise_pci,
    parse_kmsg_line,
    xid_rule,
)


@pytest.mark.parametrize(
    ("xid", "action", "urgent"),
    [
        (13, Action.MONITOR, False),
        (31, Action.MONITOR, False),
        (63, Action.MONITOR, False),
        (94, Action.MONITOR, False),
        (74, Action.RESET, False),
        (119, Action.RESET, False),
        (48, Action.RESET, True),
        (79, Action.REBOOT, True),
        (151, Action.REBOOT, True),
        (168, Action.REBOOT, True),
        (54, Action.REPLACE, False),
        (154, Action.RESET, False),
        (9999, Action.MONITOR, False),
    ],
)
def test_default_table(xid: int, action: Action, urgent: bool) -> None:
    assert xid_rule(xid) == XidRule(action, urgent)


def test_override_wins() -> None:
    assert xid_rule(79, overrides={79: XidRule(Action.REPLACE, True)}).action == Action.REPLACE


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", Action.RESET),
        (
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            Action.REBOOT,
        ),
        ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", Action.NONE),
        ("something else", Action.RESET),
    ],
)
def test_xid154_names_its_action(text: str, action: Action) -> None:
    assert xid_rule(154, text).action == action


def test_parse_kmsg_record() -> None:
    line = (
        "3,1234,567890123,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=2761, name=python3, "
        "GPU has fallen off the bus."
    )
    assert parse_kmsg_line(line) == KmsgXid(
        "0000:3b:00", 79, "pid=2761, name=python3, GPU has fallen off the bus."
    )


def test_parse_dmesg_line_with_timestamp_and_function() -> None:
    line = (
        "[ 8817.493934] NVRM: Xid (PCI:0000:B7:00): 48, pid=1, "
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer"
    )
    rec = parse_kmsg_line(line)
    assert rec is not None and (rec.pci, rec.xid) == ("0000:b7:00", 48)


def test_parse_xid_154() -> None:
    line = (
        "NVRM: Xid (PCI:0000:1a:00): 154, GPU recovery action changed from 0x0 (None) "
        "to 0x2 (Node Reboot Required)"
    )
    rec = parse_kmsg_line(line)
    assert rec is not None and xid_rule(rec.xid, rec.message).action == Action.REBOOT


@pytest.mark.parametrize(
    "line",
    [
        "",
        "6,99,1,-;usb 1-1: new high-speed USB device",
        "NVRM: GPU at PCI:0000:3b:00: GPU-1234",
        "NVRM: Xid (PCI:zz): 79, junk",
    ],
)
def test_parse_ignores_other_lines(line: str) -> None:
    assert parse_kmsg_line(line) is None


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("00000000:3B:00.0", "0000:3b:00"),
        ("0000:3b:00", "0000:3b:00"),
        ("3b:00.0", "0000:3b:00"),
        ("PCI:0001:0A:1F", "0001:0a:1f"),
    ],
)
def test_normalise_pci(raw: str, norm: str) -> None:
    assert normalise_pci(raw) == norm


def test_reader_reads_new_lines_only_and_keeps_partial(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception\n")
    reader = KmsgReader(log)
    assert [x.xid for x in reader.read_xids()] == [13]
    assert reader.read_xids() == []
    with log.open("a") as fh:
        fh.write("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, fell")
    assert reader.read_xids() == []  # no newline yet
    with log.open("a") as fh:
        fh.write(" off\n")
    assert [x.message for x in reader.read_xids()] == ["pid=1, fell off"]
    reader.close()


def test_reader_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("x\n" * 50_000)
    reader = KmsgReader(log, max_records=10)
    first = reader.read_lines()
    assert 10 <= len(first) < 50_000
    reader.close()


def test_reader_on_a_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer that never writes
    try:
        reader = KmsgReader(fifo)
        assert reader.read_lines() == []
        reader.close()
    finally:
        os.close(keep)


def test_reader_missing_source_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        KmsgReader(tmp_path / "nope").read_lines()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parse_never_raises(line: str) -> None:
    rec = parse_kmsg_line(line)
    assert rec is None or rec.xid >= 0


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=0, max_value=0xFFFF),
    st.integers(min_value=0, max_value=255),
    st.integers(min_value=0, max_value=31),
    st.integers(min_value=0, max_value=999),
)
def test_parse_round_trip(domain: int, bus: int, dev: int, xid: int) -> None:
    line = f"NVRM: Xid (PCI:{domain:04x}:{bus:02X}:{dev:02x}): {xid}, pid=7, text"
    assert parse_kmsg_line(line) == KmsgXid(f"{domain:04x}:{bus:02x}:{dev:02x}", xid, "pid=7, text")
