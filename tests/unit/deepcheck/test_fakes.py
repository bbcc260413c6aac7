"""The fake tools run as real executables and speak the real formats: what they print
goes through the same parsers as the real tools' samples."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hyperpod_agent.deepcheck.execute import run, start
from hyperpod_agent.deepcheck.model import CheckOutcome
from hyperpod_agent.deepcheck.parse_dcgm import judge_diag, parse_diag_json
from hyperpod_agent.deepcheck.parse_nccl import judge_nccl, parse_nccl
from hyperpod_agent.deepcheck.parse_nvlink import judge_nvlink, parse_nvlink_status
from hyperpod_agent.deepcheck.parse_perftest import judge_ib, parse_ib_bw
from hyperpod_agent.deepcheck.parse_stressng import judge_stress_ng, parse_stress_ng

if TYPE_CHECKING:
    from .conftest import Fakes

NCCL = ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8"]


def test_every_tool_passes_without_a_scenario(fakes: Fakes) -> None:
    env = fakes.env()
    del env["HYPERPOD_FAKE_DEEPCHECK_SCENARIO"]
    dcgm = run(["dcgmi", "diag", "-r", "3", "-j"], timeout_s=30, env=env)
    assert dcgm.returncode == 0, dcgm.stderr
    assert judge_diag(parse_diag_json(dcgm.stdout)).outcome is CheckOutcome.OK
    smi = run(["nvidia-smi", "nvlink", "--status"], timeout_s=30, env=env)
    assert judge_nvlink(parse_nvlink_status(smi.stdout), 18).outcome is CheckOutcome.OK
    stress = run(["stress-ng", "--cpu", "2", "--vm", "1", "--timeout", "5"], timeout_s=30, env=env)
    verdict = judge_stress_ng(parse_stress_ng(stress.stdout), stress.returncode or 0)
    assert verdict.outcome is CheckOutcome.OK, stress.stdout
    assert verdict.figures["cpu_bogo_ops"] == 10000


def test_dcgmi_fails_only_on_the_node_the_scenario_names(fakes: Fakes) -> None:
    fakes.write({"nodes": {"gpu-002": {"dcgmi": {"fail": [{"test": "memory", "gpu": 3}]}}}})
    bad = run(["dcgmi", "diag", "-r", "2", "-j"], timeout_s=30, env=fakes.env("gpu-002"))
    assert bad.returncode == 226  # DCGM_ST_NVVS_ERROR as an exit status
    verdict = judge_diag(parse_diag_json(bad.stdout))
    assert verdict.outcome is CheckOutcome.FAIL
    assert verdict.cause.startswith("memory failed on GPU 3: Detected 2 volatile double-bit")
    good = run(["dcgmi", "diag", "-r", "2", "-j"], timeout_s=30, env=fakes.env("gpu-001"))
    assert judge_diag(parse_diag_json(good.stdout)).outcome is CheckOutcome.OK


def test_nccl_prints_the_scenario_bandwidth(fakes: Fakes) -> None:
    fakes.write({"defaults": {"all_reduce_perf": {"busbw_gbps": 80.5}}})
    result = run(NCCL, timeout_s=30, env=fakes.env())
    report = parse_nccl(result.stdout)
    assert len(report.rows) == 31
    assert report.avg_busbw_gbps is not None and abs(report.avg_busbw_gbps - 80.5) < 0.01
    assert judge_nccl(report, 150).cause == "busbw 80.5 GB/s < floor 150 GB/s"


def test_nccl_with_one_rank_has_no_bus_bandwidth(fakes: Fakes) -> None:
    # as in nccl-tests: busbw = algbw * 2(n-1)/n
    result = run(
        ["all_reduce_perf", "-b", "1M", "-e", "64M", "-g", "1"], timeout_s=30, env=fakes.env()
    )
    assert parse_nccl(result.stdout).avg_busbw_gbps == 0


def test_nccl_corruption_and_cuda_error(fakes: Fakes) -> None:
    fakes.write(
        {
            "nodes": {
                "a": {"all_reduce_perf": {"wrong": 5}},
                "b": {"all_reduce_perf": {"cuda_error": "unspecified launch failure"}},
            }
        }
    )
    wrong = run(NCCL, timeout_s=30, env=fakes.env("a"))
    assert wrong.returncode == 7
    assert judge_nccl(parse_nccl(wrong.stdout), 1).cause.startswith("data corruption: 5 wrong")
    cuda = run(NCCL, timeout_s=30, env=fakes.env("b"))
    assert cuda.returncode == 2
    assert parse_nccl(cuda.stdout).failure == "CUDA failure 'unspecified launch failure'"


def test_nvlink_inactive_link(fakes: Fakes) -> None:
    fakes.write({"nodes": {"gpu-001": {"nvidia-smi": {"inactive": [[2, 7]]}}}})
    result = run(["nvidia-smi", "nvlink", "--status"], timeout_s=30, env=fakes.env())
    verdict = judge_nvlink(parse_nvlink_status(result.stdout), None)
    assert verdict.cause == "nvlink inactive: GPU 2 link 7"


def test_stress_ng_failure(fakes: Fakes) -> None:
    fakes.write({"defaults": {"stress-ng": {"fail": "vm: detected 3 memory errors"}}})
    result = run(
        ["stress-ng", "--vm", "2", "--timeout", "60", "--verify"], timeout_s=30, env=fakes.env()
    )
    assert result.returncode == 2
    verdict = judge_stress_ng(parse_stress_ng(result.stdout), 2)
    assert (verdict.outcome, verdict.cause) == (CheckOutcome.FAIL, "vm: detected 3 memory errors")


def test_ib_write_bw_server_and_client_talk_over_loopback(fakes: Fakes) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fakes.write({"defaults": {"ib_write_bw": {"bw_gbps": 97.5}}})
    server = start(["ib_write_bw", "-p", str(port), "--report_gbits"], env=fakes.env())
    assert server.wait_for("Waiting for client to connect", deadline=time.monotonic() + 30)
    client = run(
        ["ib_write_bw", "-p", str(port), "--report_gbits", "localhost"],
        timeout_s=30,
        env=fakes.env(),
    )
    assert client.returncode == 0, client.stderr
    verdict = judge_ib(parse_ib_bw(client.stdout), 350)
    assert verdict.cause == "ib_write_bw 97.5 Gb/s < floor 350 Gb/s at 65536 B"
    served = server.finish(deadline=time.monotonic() + 30)
    assert served.returncode == 0
    assert parse_ib_bw(served.stdout).unit == "Gb/sec"


def test_ib_write_bw_client_without_server(fakes: Fakes) -> None:
    result = run(["ib_write_bw", "-p", "1", "localhost"], timeout_s=30, env=fakes.env())
    assert result.returncode == 1
    assert result.stderr.startswith("Couldn't connect to localhost:1")


def test_invalid_scenario_is_one_line_naming_the_key(fakes: Fakes) -> None:
    fakes.write({"nodes": {"gpu-009": {"dcgmi": {"fial": []}}}})
    result = run(["dcgmi", "diag", "-r", "1", "-j"], timeout_s=30, env=fakes.env())
    assert result.returncode == 64
    assert result.stderr.count("\n") == 1
    assert "nodes.gpu-009.dcgmi: fial: Extra inputs are not permitted" in result.stderr
    fakes.write({"nodes": {"gpu-009": {"gpu-burn": {}}}})
    result = run(["dcgmi", "diag", "-r", "1", "-j"], timeout_s=30, env=fakes.env())
    assert "unknown tool 'gpu-burn'" in result.stderr


def test_garbage_delay_and_exit_code(fakes: Fakes) -> None:
    fakes.write({"defaults": {"dcgmi": {"garbage": True, "exit_code": 3}}})
    result = run(["dcgmi", "diag", "-r", "1", "-j"], timeout_s=30, env=fakes.env())
    assert result.returncode == 3
    assert "noise" in result.stdout
