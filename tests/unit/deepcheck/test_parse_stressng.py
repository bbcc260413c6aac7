"""stress-ng log lines with --metrics-brief: the metrics, the summary, the exit status."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hyperpod_agent.deepcheck.model import CheckOutcome
from hyperpod_agent.deepcheck.parse_stressng import judge_stress_ng, parse_stress_ng


def test_pass(sample: Callable[[str], str]) -> None:
    report = parse_stress_ng(sample("stressng/stress_ng_pass.txt"))
    assert report.completed is True
    assert report.failed == 0
    assert report.metrics["cpu"].bogo_ops == 5738413
    assert report.metrics["vm"].bogo_ops_per_s_real == pytest.approx(18220.33)
    verdict = judge_stress_ng(report, returncode=0)
    assert verdict.outcome is CheckOutcome.OK
    assert verdict.cause == "successful run completed: cpu 5738413, vm 1093402 bogo ops"
    assert verdict.figures["cpu_bogo_ops"] == 5738413
    assert verdict.figures["vm_bogo_ops_per_s"] == pytest.approx(18220.33)


def test_vm_verify_failure_is_a_fail_naming_the_first_failure(
    sample: Callable[[str], str],
) -> None:
    report = parse_stress_ng(sample("stressng/stress_ng_fail_vm.txt"))
    assert report.completed is False
    assert report.failed == 2
    assert report.failures[0] == "vm: detected 3 memory errors"
    verdict = judge_stress_ng(report, returncode=2)
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause == "vm: detected 3 memory errors (+1 more)"
    assert verdict.figures["vm_bogo_ops"] == 1052218


def test_exit_2_without_log_lines_still_fails() -> None:
    verdict = judge_stress_ng(parse_stress_ng(""), returncode=2)
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause == "stress-ng: stressor failed (exit 2)"


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (1, "stress-ng: core failure (exit 1)"),
        (3, "stress-ng: no resources (exit 3)"),
        (4, "stress-ng: not implemented (exit 4)"),
        (7, "stress-ng: metrics untrustworthy (exit 7)"),
        (137, "stress-ng: exit 137"),
    ],
)
def test_other_exit_codes_are_unknown(sample: Callable[[str], str], code: int, cause: str) -> None:
    verdict = judge_stress_ng(parse_stress_ng(sample("stressng/stress_ng_pass.txt")), code)
    assert verdict.outcome is CheckOutcome.UNKNOWN
    assert verdict.cause == cause


def test_truncated_output_with_exit_0_is_unknown(sample: Callable[[str], str]) -> None:
    verdict = judge_stress_ng(parse_stress_ng(sample("stressng/stress_ng_truncated.txt")), 0)
    assert verdict.outcome is CheckOutcome.UNKNOWN
    assert verdict.cause == "stress-ng exited 0 without 'run completed'"


def test_garbage_does_not_raise() -> None:
    report = parse_stress_ng("\x00\xff garbage\nstress-ng: metrc: [1] cpu lots of ops\n")
    assert report.metrics == {}
    assert judge_stress_ng(report, 0).outcome is CheckOutcome.UNKNOWN
