"""`dcgmi diag -j` documents: DCGM 4.x (entity results, test_summary) and the older
"DCGM GPU Diagnostic" shape (gpu_ids), passing, failing and broken."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from hyperpod_agent.deepcheck.model import CheckOutcome
from hyperpod_agent.deepcheck.parse_dcgm import judge_diag, parse_diag_json
from hyperpod_agent.deepcheck.parsing import ParseError


def test_level1_pass(sample: Callable[[str], str]) -> None:
    report = parse_diag_json(sample("dcgm/diag_l1_pass.json"))
    assert report.version == "4.2.3"
    assert report.gpus == 8
    verdict = judge_diag(report)
    assert verdict.outcome is CheckOutcome.OK
    assert verdict.figures["tests_passed"] == 1
    assert verdict.figures["tests_failed"] == 0
    assert verdict.figures["gpus"] == 8


def test_level3_pass_counts_every_test(sample: Callable[[str], str]) -> None:
    verdict = judge_diag(parse_diag_json(sample("dcgm/diag_l3_pass.json")))
    assert verdict.outcome is CheckOutcome.OK
    assert verdict.figures["tests_passed"] == 7
    assert "7 tests passed on 8 GPUs" in verdict.cause


def test_level3_memory_failure_names_test_gpu_and_message(sample: Callable[[str], str]) -> None:
    verdict = judge_diag(parse_diag_json(sample("dcgm/diag_l3_fail_memory.json")))
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause.startswith("memory failed on GPU 3: ")
    assert "Detected 2 volatile double-bit ECC error(s) in GPU 3." in verdict.cause
    assert verdict.figures["tests_failed"] == 1
    assert verdict.figures["tests_passed"] == 6


def test_two_failing_gpus_are_counted_in_the_cause(sample: Callable[[str], str]) -> None:
    verdict = judge_diag(parse_diag_json(sample("dcgm/diag_l2_fail_pcie.json")))
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause.startswith("pcie failed on GPU 5: GPU 5 is running at PCI link width 8X")
    assert verdict.cause.endswith("(+1 more)")
    assert "\n" not in verdict.cause


def test_all_skipped_is_unknown_not_ok(sample: Callable[[str], str]) -> None:
    verdict = judge_diag(parse_diag_json(sample("dcgm/diag_l3_all_skipped.json")))
    assert verdict.outcome is CheckOutcome.UNKNOWN
    assert verdict.cause == "no diagnostic test ran (7 skipped)"


def test_runtime_error_is_unknown(sample: Callable[[str], str]) -> None:
    verdict = judge_diag(parse_diag_json(sample("dcgm/diag_runtime_error.json")))
    assert verdict.outcome is CheckOutcome.UNKNOWN
    assert verdict.cause.startswith("dcgmi diag could not run: Error: Unable to complete")


def test_legacy_document_warn_is_not_a_failure_but_fail_is(sample: Callable[[str], str]) -> None:
    report = parse_diag_json(sample("dcgm/diag_legacy_l2_warn_fail.json"))
    assert report.version == "2.4.8"
    verdict = judge_diag(report)
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause.startswith("GPU Memory failed on GPU 2: Error using CUDA API cudaMalloc")
    assert verdict.figures["tests_warned"] == 1


def test_legacy_warn_alone_is_ok_and_says_so() -> None:
    doc = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Integration",
                    "tests": [
                        {
                            "name": "PCIe",
                            "results": [
                                {"gpu_ids": "0", "status": "Pass"},
                                {
                                    "gpu_ids": "1",
                                    "status": "Warn",
                                    "warnings": [{"warning": "slow host-to-device copy"}],
                                },
                            ],
                        }
                    ],
                }
            ]
        }
    }
    verdict = judge_diag(parse_diag_json(json.dumps(doc)))
    assert verdict.outcome is CheckOutcome.OK
    assert "warned: PCIe on GPU 1: slow host-to-device copy" in verdict.cause


def test_summary_failure_without_entity_result_still_fails() -> None:
    doc = {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Hardware",
                    "tests": [
                        {
                            "name": "diagnostic",
                            "results": [],
                            "test_summary": {
                                "status": "Fail",
                                "warnings": [{"warning": "Test was aborted early"}],
                            },
                        }
                    ],
                }
            ]
        }
    }
    verdict = judge_diag(parse_diag_json(json.dumps(doc)))
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause == "diagnostic failed: Test was aborted early"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Error: Unable to start an embedded host engine. Generic unspecified error.\n",
        "[1, 2, 3]",
        '{"something": "else"}',
        '{"DCGM Diagnostic": {"test_categories": "not a list"}}',
        '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"results": [7]}]}]}}',
    ],
)
def test_garbage_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_diag_json(text)


def test_truncated_document_is_a_parse_error(sample: Callable[[str], str]) -> None:
    with pytest.raises(ParseError, match="not JSON"):
        parse_diag_json(sample("dcgm/diag_truncated.json"))
