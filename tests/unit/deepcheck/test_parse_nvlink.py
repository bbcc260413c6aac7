"""`nvidia-smi nvlink --status`: a link is up only with a bandwidth figure."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hyperpod_agent.deepcheck.model import CheckOutcome
from hyperpod_agent.deepcheck.parse_nvlink import judge_nvlink, parse_nvlink_status
from hyperpod_agent.deepcheck.parsing import ParseError


def test_all_up(sample: Callable[[str], str]) -> None:
    gpus = parse_nvlink_status(sample("nvlink/nvlink_status_all_up.txt"))
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert len(gpus[0].links) == 18
    verdict = judge_nvlink(gpus, expected_links_per_gpu=18)
    assert verdict.outcome is CheckOutcome.OK
    assert verdict.cause == "72 links up on 4 GPUs"
    assert verdict.figures == {"gpus": 4, "links_up": 72, "links_inactive": 0}


def test_inactive_links_fail_naming_gpu_and_link(sample: Callable[[str], str]) -> None:
    verdict = judge_nvlink(parse_nvlink_status(sample("nvlink/nvlink_status_inactive.txt")), None)
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause == "nvlink inactive: GPU 2 link 7, GPU 2 link 8"
    assert verdict.figures["links_inactive"] == 2


def test_fewer_links_than_expected_fails() -> None:
    text = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-x)\n\t Link 0: 25 GB/s\n\t Link 1: 25 GB/s\n"
    verdict = judge_nvlink(parse_nvlink_status(text), expected_links_per_gpu=12)
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause == "nvlink: GPU 0 has 2 links up, expected 12"


def test_unrecognised_status_is_unknown_not_up(sample: Callable[[str], str]) -> None:
    gpus = parse_nvlink_status(sample("nvlink/nvlink_status_unrecognised.txt"))
    verdict = judge_nvlink(gpus, None)
    assert verdict.outcome is CheckOutcome.UNKNOWN
    assert verdict.cause == "nvlink: GPU 1 link 4 status not understood: 'N/A'"


def test_gpus_without_nvlink_pass_unless_links_are_expected(
    sample: Callable[[str], str],
) -> None:
    gpus = parse_nvlink_status(sample("nvlink/nvlink_status_no_nvlink.txt"))
    assert [len(g.links) for g in gpus] == [0, 0]
    assert judge_nvlink(gpus, None).outcome is CheckOutcome.OK
    assert judge_nvlink(gpus, 4).outcome is CheckOutcome.FAIL


@pytest.mark.parametrize("text", ["", "No devices were found\n", "\t Link 0: 25 GB/s\n"])
def test_no_gpu_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_nvlink_status(text)
