"""run_suite against the fake tools, as real subprocesses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hyperpod_agent.deepcheck import parse_dcgm
from hyperpod_agent.deepcheck.config import Suite
from hyperpod_agent.deepcheck.model import CheckOutcome
from hyperpod_agent.deepcheck.runner import run_suite
from hyperpod_agent.errors import ConfigError

if TYPE_CHECKING:
    from .conftest import Fakes

DCGM = {"name": "dcgm", "kind": "dcgm", "diag_level": 2}
NVLINK = {"name": "nvlink", "kind": "nvlink", "expected_links_per_gpu": 18}
NCCL = {
    "name": "nccl",
    "kind": "nccl",
    "args": ["-b", "8", "-e", "8G", "-f", "2", "-g", "8"],
    "min_busbw_gbps": 150,
}
IB = {"name": "ib", "kind": "ib", "min_ib_gbps": 350}
STRESS = {"name": "stress", "kind": "stress", "duration_s": 5, "cpu": 2, "vm": 1}


def suite(*checks: dict[str, Any], **settings: Any) -> Suite:
    return Suite.model_validate({"checks": list(checks), **settings})


def test_healthy_node_passes_every_check_in_order(fakes: Fakes) -> None:
    result = run_suite(suite(DCGM, NVLINK, NCCL, IB, STRESS), "quick", env=fakes.env("gpu-001"))
    assert [r.check for r in result.results] == ["dcgm", "nvlink", "nccl", "ib", "stress"]
    assert [r.outcome for r in result.results] == [CheckOutcome.OK] * 5
    assert result.outcome is CheckOutcome.OK and result.exit_code == 0
    assert result.nodes == ["gpu-001"]
    assert result.results[0].command == ["dcgmi", "diag", "-r", "2", "-j"]
    assert result.results[0].nodes == ["gpu-001"]
    assert result.results[2].figures["avg_busbw_gbps"] == pytest.approx(180, abs=0.01)
    assert result.results[3].figures["bw_avg_gbps"] == pytest.approx(390, abs=0.01)
    assert result.results[4].command == [
        "stress-ng",
        "--cpu",
        "2",
        "--vm",
        "1",
        "--vm-bytes",
        "50%",
        "--timeout",
        "5s",
        "--metrics-brief",
        "--verify",
    ]


def test_failing_dcgm_names_the_test(fakes: Fakes) -> None:
    fakes.write({"nodes": {"gpu-002": {"dcgmi": {"fail": [{"test": "pcie", "gpu": 6}]}}}})
    result = run_suite(suite(DCGM, NVLINK), "quick", env=fakes.env("gpu-002"))
    dcgm = result.results[0]
    assert dcgm.outcome is CheckOutcome.FAIL
    assert dcgm.cause == "pcie failed on GPU 6: Test pcie failed on GPU 6."
    assert dcgm.figures["tests_failed"] == 1
    assert result.outcome is CheckOutcome.FAIL and result.exit_code == 1
    assert result.results[1].outcome is CheckOutcome.OK  # no stop_on_fail: the rest ran


def test_busbw_below_floor_fails_with_figures(fakes: Fakes) -> None:
    fakes.write({"defaults": {"all_reduce_perf": {"busbw_gbps": 96.25}}})
    (nccl,) = run_suite(suite(NCCL), "full", env=fakes.env()).results
    assert nccl.outcome is CheckOutcome.FAIL
    assert nccl.cause == "busbw 96.2 GB/s < floor 150 GB/s"
    assert nccl.figures["avg_busbw_gbps"] == pytest.approx(96.25, abs=0.01)
    assert nccl.figures["max_busbw_gbps"] > 96.25


def test_missing_binary_is_unknown_naming_it(fakes: Fakes) -> None:
    (fakes.bin / "all_reduce_perf").unlink()
    result = run_suite(suite(DCGM, NCCL), "quick", env=fakes.env())
    nccl = result.results[1]
    assert nccl.outcome is CheckOutcome.UNKNOWN
    assert nccl.cause == "all_reduce_perf: not found on PATH"
    assert result.outcome is CheckOutcome.UNKNOWN and result.exit_code == 3


def test_missing_binary_behind_a_launcher_is_named(fakes: Fakes) -> None:
    (fakes.bin / "all_reduce_perf").unlink()
    check = {**NCCL, "launcher": ["env", "NCCL_DEBUG=WARN"]}
    (nccl,) = run_suite(suite(check), "quick", env=fakes.env()).results
    assert nccl.cause == "all_reduce_perf: not found on PATH"


def test_hung_tool_is_killed_at_its_time_limit(fakes: Fakes, gone: Callable[[int], bool]) -> None:
    fakes.write({"pid_file": str(fakes.pid_file), "defaults": {"dcgmi": {"hang": True}}})
    # A limit well past the fake's start-up (about 0.3 s; seconds on a loaded machine),
    # so it has written its pids and started its child before it is killed.
    check = {**DCGM, "timeout_s": 6}
    (dcgm,) = run_suite(suite(check, kill_grace_s=0.5), "quick", env=fakes.env()).results
    assert dcgm.outcome is CheckOutcome.UNKNOWN
    assert dcgm.cause == "timed out after 6 s"
    pids = fakes.pids()
    assert len(pids) == 2  # the fake and the child it started in its group
    assert all(gone(pid) for pid in pids)


def test_hung_tool_ignoring_sigterm_is_killed_too(
    fakes: Fakes, gone: Callable[[int], bool]
) -> None:
    fakes.write(
        {
            "pid_file": str(fakes.pid_file),
            "defaults": {"stress-ng": {"hang": True, "ignore_sigterm": True}},
        }
    )
    check = {**STRESS, "duration_s": 1, "timeout_s": 6}
    (stress,) = run_suite(suite(check, kill_grace_s=0.2), "quick", env=fakes.env()).results
    assert stress.cause == "timed out after 6 s"
    assert all(gone(pid) for pid in fakes.pids())


def test_garbage_output_is_unknown_never_fail(fakes: Fakes) -> None:
    fakes.write({"defaults": {"dcgmi": {"garbage": True}, "nvidia-smi": {"garbage": True}}})
    dcgm, nvlink = run_suite(suite(DCGM, NVLINK), "quick", env=fakes.env()).results
    assert dcgm.outcome is CheckOutcome.UNKNOWN
    assert dcgm.cause.startswith("dcgmi: output not understood (not JSON")
    assert nvlink.outcome is CheckOutcome.UNKNOWN
    assert nvlink.cause.startswith("nvidia-smi: output not understood (no GPU line)")


def test_a_parser_bug_is_unknown_never_fail(fakes: Fakes, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(text: str) -> parse_dcgm.DiagReport:
        raise KeyError("entity_id")

    monkeypatch.setattr(parse_dcgm, "parse_diag_json", broken)
    (dcgm,) = run_suite(suite(DCGM), "quick", env=fakes.env()).results
    assert dcgm.outcome is CheckOutcome.UNKNOWN
    assert dcgm.cause == "dcgmi: internal error judging the output: KeyError: 'entity_id'"


def test_stop_on_fail_skips_the_rest_after_a_gating_failure(fakes: Fakes) -> None:
    fakes.write({"defaults": {"nvidia-smi": {"inactive": [[0, 1]]}}})
    checks = ({**NVLINK, "gating": False}, DCGM, {**NVLINK, "name": "nvlink-gate"}, STRESS)
    result = run_suite(suite(*checks, stop_on_fail=True), "quick", env=fakes.env())
    # a non-gating failure never stops the suite; the gating one does
    assert [r.check for r in result.results] == ["nvlink", "dcgm", "nvlink-gate"]
    assert result.skipped == ["stress"]
    assert result.outcome is CheckOutcome.FAIL


def test_non_gating_failure_does_not_fail_the_suite(fakes: Fakes) -> None:
    fakes.write({"defaults": {"nvidia-smi": {"inactive": [[0, 1]]}}})
    result = run_suite(suite({**NVLINK, "gating": False}, DCGM), "quick", env=fakes.env())
    assert result.results[0].outcome is CheckOutcome.FAIL
    assert result.outcome is CheckOutcome.OK and result.exit_code == 0


def test_ib_loopback_below_floor_and_with_a_peer(fakes: Fakes) -> None:
    fakes.write({"defaults": {"ib_write_bw": {"bw_gbps": 100}}})
    (ib,) = run_suite(suite({**IB, "device": "mlx5_1"}), "quick", env=fakes.env()).results
    assert ib.outcome is CheckOutcome.FAIL
    assert ib.cause == "ib_write_bw 100.0 Gb/s < floor 350 Gb/s at 1048576 B"
    assert ib.command[:3] == ["ib_write_bw", "-d", "mlx5_1"]
    assert ib.command[-1] == "localhost"
    # against a peer nobody serves, the client cannot connect: UNKNOWN, both nodes named
    peer = {**IB, "peer": "localhost", "port": 1}
    (ib,) = run_suite(suite(peer), "quick", env=fakes.env("gpu-001")).results
    assert ib.outcome is CheckOutcome.UNKNOWN
    assert ib.cause.startswith(
        "ib_write_bw: output not understood (no result table); it said: "
        "Couldn't connect to localhost:1"
    )
    assert ib.nodes == ["gpu-001", "localhost"]


def test_ib_loopback_server_that_never_listens(fakes: Fakes) -> None:
    fakes.write(
        {"defaults": {"ib_write_bw": {"error": "Unable to find the Infiniband/RoCE device"}}}
    )
    (ib,) = run_suite(suite(IB), "quick", env=fakes.env()).results
    assert ib.outcome is CheckOutcome.UNKNOWN
    assert ib.cause == (
        "ib_write_bw server did not start listening: Unable to find the Infiniband/RoCE device"
    )


@pytest.mark.parametrize(
    ("body", "outcome", "cause"),
    [
        ("echo fine; exit 0", CheckOutcome.OK, "fine"),
        ("echo 'dimm B2 degraded'; exit 1", CheckOutcome.FAIL, "dimm B2 degraded"),
        ("echo 'cannot tell'; exit 2", CheckOutcome.UNKNOWN, "exit 2: cannot tell"),
        ("exit 137", CheckOutcome.UNKNOWN, "exit 137"),
        ("exit 0", CheckOutcome.OK, "exit 0"),
    ],
)
def test_admin_script_follows_the_script_probe_contract(
    fakes: Fakes, tmp_path: Path, body: str, outcome: CheckOutcome, cause: str
) -> None:
    script = tmp_path / "site-check"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    check = {"name": "site", "kind": "script", "path": str(script), "args": ["--deep"]}
    (result,) = run_suite(suite(check), "quick", env=fakes.env()).results
    assert (result.outcome, result.cause) == (outcome, cause)
    assert result.command == [str(script), "--deep"]


def test_a_level_without_gating_checks_is_refused(fakes: Fakes) -> None:
    with pytest.raises(ConfigError, match="no gating check at level 'full'"):
        run_suite(suite({**DCGM, "levels": ["quick"]}), "full", env=fakes.env())
    with pytest.raises(ConfigError, match="no gating check at level 'quick'"):
        run_suite(suite({**DCGM, "gating": False}), "quick", env=fakes.env())
    with pytest.raises(ConfigError, match="unknown level 'medium'"):
        run_suite(suite(DCGM), "medium", env=fakes.env())


def test_node_defaults_to_slurm_name_and_can_be_given(fakes: Fakes) -> None:
    result = run_suite(suite(DCGM), "quick", env=fakes.env("gpu-077"))
    assert result.nodes == ["gpu-077"]
    result = run_suite(suite(DCGM), "quick", nodes=["spare-3"], env=fakes.env("gpu-077"))
    assert result.nodes == ["spare-3"] and result.results[0].nodes == ["spare-3"]
