"""What each kind of check runs, and the judging rules every kind shares (pure)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import TypeAdapter

from hyperpod_agent.deepcheck.checks import command, judge
from hyperpod_agent.deepcheck.config import Check
from hyperpod_agent.deepcheck.execute import Execution
from hyperpod_agent.deepcheck.model import CheckOutcome

CHECK: TypeAdapter[Check] = TypeAdapter(Check)


def check(**fields: Any) -> Check:
    return CHECK.validate_python({"name": "c", **fields})


@pytest.mark.parametrize(
    ("fields", "argv"),
    [
        ({"kind": "dcgm", "diag_level": 3}, ["dcgmi", "diag", "-r", "3", "-j"]),
        (
            {"kind": "dcgm", "executable": "/usr/bin/dcgmi", "extra_args": ["-i", "0,1"]},
            ["/usr/bin/dcgmi", "diag", "-r", "1", "-j", "-i", "0,1"],
        ),
        (
            {"kind": "nccl", "min_busbw_gbps": 1},
            ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1"],
        ),
        (
            {
                "kind": "nccl",
                "min_busbw_gbps": 1,
                "launcher": ["mpirun", "-np", "8"],
                "args": ["-b", "1G", "-e", "1G"],
            },
            ["mpirun", "-np", "8", "all_reduce_perf", "-b", "1G", "-e", "1G"],
        ),
        ({"kind": "nvlink"}, ["nvidia-smi", "nvlink", "--status"]),
        (
            {"kind": "ib", "min_ib_gbps": 1, "peer": "gpu-018", "args": ["--report_gbits"]},
            ["ib_write_bw", "--report_gbits", "gpu-018"],
        ),
        (
            {"kind": "stress", "cpu": 0, "vm": 0, "verify": False, "duration_s": 30},
            ["stress-ng", "--cpu", "0", "--timeout", "30s", "--metrics-brief"],
        ),
        ({"kind": "script", "path": "/opt/x", "args": ["a b"]}, ["/opt/x", "a b"]),
    ],
)
def test_command(fields: dict[str, Any], argv: list[str]) -> None:
    assert command(check(**fields)) == argv


def test_ib_server_and_client_commands_share_device_port_and_args() -> None:
    ib = check(kind="ib", min_ib_gbps=1, device="mlx5_2", args=["-s", "65536"])
    server = command(ib, port=4000, server=True)
    assert server == ["ib_write_bw", "-d", "mlx5_2", "-p", "4000", "-s", "65536"]
    assert command(ib, port=4000) == [*server, "localhost"]


NVLINK_OK = "GPU 0: NVIDIA H100 (UUID: GPU-1)\n\t Link 0: 26.562 GB/s\n"


def ran(**fields: Any) -> Execution:
    return Execution(argv=("tool",), **fields)


def test_success_with_a_nonzero_exit_is_a_contradiction_not_an_ok() -> None:
    verdict = judge(check(kind="nvlink"), ran(returncode=3, stdout=NVLINK_OK))
    assert verdict.outcome is CheckOutcome.UNKNOWN
    assert verdict.cause == "nvidia-smi exited 3 after reporting: 1 links up on 1 GPUs"
    assert verdict.figures["links_up"] == 1


def test_a_failure_with_a_nonzero_exit_stays_a_failure(sample: Callable[[str], str]) -> None:
    text = sample("nccl/all_reduce_wrong.txt")
    verdict = judge(check(kind="nccl", min_busbw_gbps=1), ran(returncode=7, stdout=text))
    assert verdict.outcome is CheckOutcome.FAIL


def test_timeout_names_the_processes_that_would_not_die() -> None:
    verdict = judge(check(kind="dcgm", timeout_s=30), ran(timed_out=True, survivors=(812, 813)))
    assert verdict.outcome is CheckOutcome.UNKNOWN
    assert verdict.cause == "timed out after 30 s; 2 of its processes survived SIGKILL: 812 813"


def test_cut_output_is_said(sample: Callable[[str], str]) -> None:
    text = sample("dcgm/diag_l3_pass.json")[:4096]
    verdict = judge(check(kind="dcgm"), ran(returncode=0, stdout=text, truncated=True))
    assert verdict.outcome is CheckOutcome.UNKNOWN
    assert "(output was cut at the limit)" in verdict.cause


def test_start_error_is_unknown_with_its_message() -> None:
    verdict = judge(check(kind="nvlink"), ran(error="nvidia-smi: not found on PATH"))
    assert (verdict.outcome, verdict.cause) == (
        CheckOutcome.UNKNOWN,
        "nvidia-smi: not found on PATH",
    )


def test_cause_is_always_one_bounded_line() -> None:
    verdict = judge(check(kind="script", path="/opt/x"), ran(returncode=1, stdout="a\n" * 400))
    assert verdict.outcome is CheckOutcome.FAIL
    assert "\n" not in verdict.cause and len(verdict.cause) <= 300
