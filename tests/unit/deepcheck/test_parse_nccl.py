"""nccl-tests `all_reduce_perf` text output: the table, the footer, corruption, failures."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hyperpod_agent.deepcheck.model import CheckOutcome
from hyperpod_agent.deepcheck.parse_nccl import judge_nccl, parse_nccl
from hyperpod_agent.deepcheck.parsing import ParseError


def test_pass_reads_rows_and_footer(sample: Callable[[str], str]) -> None:
    report = parse_nccl(sample("nccl/all_reduce_pass.txt"))
    assert len(report.rows) == 31
    assert report.rows[0].size == 8
    assert report.rows[-1].size == 8589934592
    assert report.avg_busbw_gbps == pytest.approx(173.677)
    assert report.out_of_bounds == 0
    assert report.failure is None
    verdict = judge_nccl(report, min_busbw_gbps=150.0)
    assert verdict.outcome is CheckOutcome.OK
    assert verdict.cause == "busbw 173.7 GB/s >= floor 150 GB/s"
    assert verdict.figures["avg_busbw_gbps"] == pytest.approx(173.677)
    assert verdict.figures["max_busbw_gbps"] == pytest.approx(479.72)
    assert verdict.figures["wrong"] == 0


def test_low_busbw_fails_with_both_figures(sample: Callable[[str], str]) -> None:
    verdict = judge_nccl(parse_nccl(sample("nccl/all_reduce_low_busbw.txt")), min_busbw_gbps=150)
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause == "busbw 76.9 GB/s < floor 150 GB/s"
    assert verdict.figures["avg_busbw_gbps"] == pytest.approx(76.8993)


def test_wrong_elements_fail_even_with_good_bandwidth(sample: Callable[[str], str]) -> None:
    report = parse_nccl(sample("nccl/all_reduce_wrong.txt"))
    assert report.out_of_bounds == 2
    verdict = judge_nccl(report, min_busbw_gbps=100)
    assert verdict.outcome is CheckOutcome.FAIL
    # the table prints #wrong with %g: 1048576 and 2097152 read back as 1.04858e+06 and
    # 2.09715e+06
    assert verdict.cause == (
        "data corruption: 3145730 wrong elements in 2 results (first at 268435456 B in-place)"
    )
    assert verdict.figures["wrong"] == pytest.approx(3145730)


def test_cuda_failure_is_a_fail_naming_the_error(sample: Callable[[str], str]) -> None:
    report = parse_nccl(sample("nccl/all_reduce_cuda_error.txt"))
    assert report.failure == "CUDA failure 'uncorrectable ECC error encountered'"
    verdict = judge_nccl(report, min_busbw_gbps=100)
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause == "all_reduce_perf: CUDA failure 'uncorrectable ECC error encountered'"


def test_nccl_failure_line() -> None:
    text = (
        "# nccl-tests version 2.17.1 nccl-headers=22703 nccl-library=22703\n"
        "gpu-9: Test NCCL failure common.cu:1005 'unhandled system error (run with "
        "NCCL_DEBUG=INFO for details) / '\n"
        " .. gpu-9 pid 811: Test failure common.cu:1180\n"
    )
    report = parse_nccl(text)
    assert report.failure is not None
    assert report.failure.startswith("NCCL failure 'unhandled system error")


def test_truncated_output_is_a_parse_error(sample: Callable[[str], str]) -> None:
    with pytest.raises(ParseError, match="no 'Avg bus bandwidth' line"):
        parse_nccl(sample("nccl/all_reduce_truncated.txt"))


def test_validation_off_reads_na_as_unknown_wrong() -> None:
    text = (
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
        "     time   algbw   busbw  #wrong\n"
        "   134217728      33554432     float     sum      -1    509.4  263.49  461.11    N/A"
        "    514.3  260.97  456.70    N/A\n"
        "# Out of bounds values : 0 OK\n"
        "# Avg bus bandwidth    : 458.905 \n"
    )
    report = parse_nccl(text)
    assert report.rows[0].oop_wrong is None
    verdict = judge_nccl(report, min_busbw_gbps=400)
    assert verdict.outcome is CheckOutcome.OK
    assert "wrong" not in verdict.figures


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\x00\x01garbage\n",
        "# Avg bus bandwidth    : fast \n",
        "   8   2   float   sum   -1   x   y   z   0   1   2   3   0\n# Avg bus bandwidth : 1\n",
    ],
)
def test_garbage_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_nccl(text)
