"""perftest `ib_write_bw` client reports, in Gb/s and in MiB/s."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hyperpod_agent.deepcheck.model import CheckOutcome
from hyperpod_agent.deepcheck.parse_perftest import judge_ib, parse_ib_bw
from hyperpod_agent.deepcheck.parsing import ParseError


def test_gbits_report(sample: Callable[[str], str]) -> None:
    report = parse_ib_bw(sample("perftest/ib_write_bw_gbits.txt"))
    assert report.unit == "Gb/sec"
    assert len(report.rows) == 1
    assert report.rows[0].size == 1048576
    verdict = judge_ib(report, min_gbps=350)
    assert verdict.outcome is CheckOutcome.OK
    assert verdict.cause == "ib_write_bw 391.9 Gb/s >= floor 350 Gb/s at 1048576 B"
    assert verdict.figures["bw_avg_gbps"] == pytest.approx(391.87)
    assert verdict.figures["bw_peak_gbps"] == pytest.approx(392.41)


def test_mib_report_is_converted_to_gbits(sample: Callable[[str], str]) -> None:
    report = parse_ib_bw(sample("perftest/ib_write_bw_mib.txt"))
    assert report.unit == "MiB/sec"
    verdict = judge_ib(report, min_gbps=350)
    assert verdict.outcome is CheckOutcome.OK
    # perftest's MiB is 2^20 bytes; 46714.54 MiB/s is 391.87 Gb/s
    assert verdict.figures["bw_avg_gbps"] == pytest.approx(391.87, abs=0.01)


def test_old_mb_label_is_the_same_unit() -> None:
    text = (
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
        " 65536      1000             11743.89            11741.61		     0.187866\n"
    )
    report = parse_ib_bw(text)
    assert report.unit == "MB/sec"
    verdict = judge_ib(report, min_gbps=50)
    assert verdict.figures["bw_avg_gbps"] == pytest.approx(11741.61 * 1048576 * 8 / 1e9)


def test_below_floor_fails(sample: Callable[[str], str]) -> None:
    verdict = judge_ib(parse_ib_bw(sample("perftest/ib_write_bw_gbits_low.txt")), min_gbps=350)
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause == "ib_write_bw 97.1 Gb/s < floor 350 Gb/s at 1048576 B"


def test_all_sizes_judges_the_largest_message(sample: Callable[[str], str]) -> None:
    report = parse_ib_bw(sample("perftest/ib_write_bw_all_sizes.txt"))
    assert len(report.rows) == 23
    verdict = judge_ib(report, min_gbps=350)
    assert verdict.outcome is CheckOutcome.OK
    assert verdict.figures["size_bytes"] == 8388608


@pytest.mark.parametrize(
    "name", ["perftest/ib_write_bw_connect_failed.txt", "nvlink/nvlink_status_all_up.txt"]
)
def test_no_table_is_a_parse_error(sample: Callable[[str], str], name: str) -> None:
    with pytest.raises(ParseError, match="no result table"):
        parse_ib_bw(sample(name))


def test_header_without_rows_is_a_parse_error() -> None:
    text = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
    with pytest.raises(ParseError, match="no result row"):
        parse_ib_bw(text)
