"""The gpu probe against the fake (scenario file) backend."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hyperpod_agent.health import Action, Finding, Status
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.gpu import GpuConfig, GpuProbe

CTX = ProbeContext(node_name="node1")


def write(path: Path, scenario: dict[str, Any]) -> None:
    """Write a scenario and make sure its mtime moves, as a human edit would."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(json.dumps(scenario))
    os.utime(path, ns=(before + 10**9, before + 10**9))


def make_probe(tmp_path: Path, scenario: dict[str, Any], **cfg: Any) -> tuple[GpuProbe, Path]:
    path = tmp_path / "scenario.json"
    write(path, scenario)
    settings: dict[str, Any] = {
        "backend": "fake",
        "fake_scenario": path,
        "kmsg_path": None,
        "expected_count": 8,
    }
    settings.update(cfg)
    return GpuProbe(GpuConfig(**settings), CTX), path


def finding(findings: list[Finding], code: str) -> Finding:
    matches = [f for f in findings if f.code == code]
    assert matches, f"no {code} in {findings}"
    return matches[0]


def test_healthy_eight_gpus(tmp_path: Path) -> None:
    probe, _ = make_probe(tmp_path, {"generate": 8})
    out = probe.check()
    assert out.status == Status.OK
    assert out.findings == []
    assert "8 GPUs" in out.message


def test_xid79_after_live_edit_fails_reboot_urgent_in_one_check(tmp_path: Path) -> None:
    probe, path = make_probe(tmp_path, {"generate": 8})
    assert probe.check().status == Status.OK
    write(
        path,
        {
            "generate": 8,
            "xid_events": [{"gpu": 3, "xid": 79, "message": "GPU has fallen off the bus"}],
        },
    )
    out = probe.check()
    assert out.status == Status.FAIL
    f = finding(out.findings, "xid79")
    assert (f.component, f.action, f.urgent) == ("gpu3", Action.REBOOT, True)
    assert probe.xid_counts == {79: 1}


def test_fatal_xid_stays_reported_until_restart(tmp_path: Path) -> None:
    probe, _ = make_probe(tmp_path, {"generate": 8, "xid_events": [{"gpu": 1, "xid": 79}]})
    probe.check()
    again = probe.check()  # the event is delivered once, the fault stays
    assert finding(again.findings, "xid79").component == "gpu1"
    assert probe.xid_counts == {79: 1}


def test_xid13_is_monitor_warn_not_fail(tmp_path: Path) -> None:
    probe, _ = make_probe(tmp_path, {"generate": 8, "xid_events": [{"gpu": 0, "xid": 13}]})
    out = probe.check()
    assert out.status == Status.WARN
    f = finding(out.findings, "xid13")
    assert (f.action, f.urgent) == (Action.MONITOR, False)


def test_monitor_xid_expires_after_window(tmp_path: Path) -> None:
    probe, _ = make_probe(
        tmp_path, {"generate": 8, "xid_events": [{"gpu": 0, "xid": 13}]}, xid_window_s=0.01
    )
    probe.check()
    import time

    time.sleep(0.05)
    assert probe.check().status == Status.OK


def test_xid_action_override_from_config(tmp_path: Path) -> None:
    probe, _ = make_probe(
        tmp_path,
        {"generate": 8, "xid_events": [{"gpu": 2, "xid": 13}]},
        xid_actions={"13": {"action": "REPLACE", "urgent": True}},
    )
    f = finding(probe.check().findings, "xid13")
    assert (f.status, f.action, f.urgent) == (Status.FAIL, Action.REPLACE, True)


def test_seven_of_eight_gpus_fails_urgent(tmp_path: Path) -> None:
    probe, _ = make_probe(tmp_path, {"generate": 7})
    out = probe.check()
    assert out.status == Status.FAIL
    f = finding(out.findings, "gpu_count")
    assert (f.action, f.urgent) == (Action.REBOOT, True)
    assert "7 GPUs visible, 8 expected" in f.message


def test_count_defaults_to_first_sample(tmp_path: Path) -> None:
    probe, path = make_probe(tmp_path, {"generate": 4}, expected_count=None)
    assert probe.check().status == Status.OK
    write(path, {"generate": 3})
    assert finding(probe.check().findings, "gpu_count").status == Status.FAIL


def test_lost_gpu(tmp_path: Path) -> None:
    probe, _ = make_probe(tmp_path, {"generate": 8, "gpus": [{"index": 5, "lost": True}]})
    f = finding(probe.check().findings, "gpu_lost")
    assert (f.component, f.action, f.urgent, f.status) == ("gpu5", Action.REBOOT, True, Status.FAIL)


def test_not_supported_fields_do_not_fail(tmp_path: Path) -> None:
    ns = "not_supported"
    gpu = {
        "index": 0,
        "temperature": ns,
        "ecc": ns,
        "row_remap": {"pending": ns, "failure": ns},
        "retired_pages": ns,
        "nvlink": ns,
        "throttle_reasons": ns,
        "pcie": {"width": ns, "max_width": 16, "gen": 4, "max_gen": ns},
    }
    probe, _ = make_probe(tmp_path, {"generate": 8, "gpus": [gpu]})
    out = probe.check()
    assert out.status == Status.OK, out.message


def test_invalid_scenario_is_reported_and_previous_kept(tmp_path: Path) -> None:
    probe, path = make_probe(tmp_path, {"generate": 8})
    probe.check()
    write(path, {"generate": 8, "gpus": [{"index": 0, "temprature": 50}]})
    out = probe.check()
    assert out.status == Status.UNKNOWN  # the machinery, not the node
    f = finding(out.findings, "backend_error")
    assert "temprature" in f.message and "previous scenario kept" in f.message
    assert not [x for x in out.findings if x.code == "gpu_count"]  # still 8 GPUs
    write(path, {"generate": 8})
    assert probe.check().status == Status.OK


def test_invalid_json_at_start_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    probe = GpuProbe(GpuConfig(backend="fake", fake_scenario=path, kmsg_path=None), CTX)
    out = probe.check()
    assert out.status == Status.UNKNOWN
    assert "invalid JSON" in out.message


def test_missing_scenario_is_unknown(tmp_path: Path) -> None:
    cfg = GpuConfig(backend="fake", fake_scenario=tmp_path / "nope.json", kmsg_path=None)
    assert GpuProbe(cfg, CTX).check().status == Status.UNKNOWN


def test_nvml_error_is_unknown(tmp_path: Path) -> None:
    probe, _ = make_probe(tmp_path, {"generate": 8, "nvml_error": "Driver Not Loaded"})
    out = probe.check()
    assert out.status == Status.UNKNOWN
    assert "Driver Not Loaded" in out.message


def test_per_gpu_nvml_error_is_unknown_finding(tmp_path: Path) -> None:
    probe, _ = make_probe(
        tmp_path, {"generate": 8, "gpus": [{"index": 1, "nvml_error": "Unknown Error"}]}
    )
    out = probe.check()
    assert finding(out.findings, "nvml_error").status == Status.UNKNOWN
    assert out.status == Status.UNKNOWN


@pytest.mark.parametrize("ecc", [{"volatile": 2, "aggregate": 2}])
def test_volatile_uncorrectable_ecc(tmp_path: Path, ecc: dict[str, int]) -> None:
    probe, _ = make_probe(tmp_path, {"generate": 8, "gpus": [{"index": 4, "ecc": ecc}]})
    f = finding(probe.check().findings, "ecc_uncorrectable")
    assert (f.component, f.status, f.action, f.urgent) == ("gpu4", Status.FAIL, Action.RESET, True)


def test_aggregate_ecc_growth_fails_and_latches(tmp_path: Path) -> None:
    gpu = {"index": 4, "ecc": {"volatile": "not_supported", "aggregate": 3}}
    probe, path = make_probe(tmp_path, {"generate": 8, "gpus": [gpu]})
    assert probe.check().status == Status.OK  # old errors, already handled
    write(
        path,
        {"generate": 8, "gpus": [{**gpu, "ecc": {"volatile": "not_supported", "aggregate": 4}}]},
    )
    assert finding(probe.check().findings, "ecc_uncorrectable").urgent
    assert finding(probe.check().findings, "ecc_uncorrectable").status == Status.FAIL


def test_row_remap_failure_replace(tmp_path: Path) -> None:
    probe, _ = make_probe(
        tmp_path,
        {"generate": 8, "gpus": [{"index": 2, "row_remap": {"pending": True, "failure": True}}]},
    )
    out = probe.check()
    f = finding(out.findings, "row_remap_failure")
    assert (f.status, f.action, f.urgent) == (Status.FAIL, Action.REPLACE, False)
    assert not [x for x in out.findings if x.code == "row_remap_pending"]


def test_row_remap_pending_reset(tmp_path: Path) -> None:
    probe, _ = make_probe(
        tmp_path, {"generate": 8, "gpus": [{"index": 2, "row_remap": {"pending": True}}]}
    )
    assert finding(probe.check().findings, "row_remap_pending").action == Action.RESET


def test_retired_pages_limit_and_pending(tmp_path: Path) -> None:
    probe, _ = make_probe(
        tmp_path,
        {
            "generate": 8,
            "gpus": [
                {"index": 0, "retired_pages": {"count": 60}},
                {"index": 1, "retired_pages": {"count": 3, "pending": True}},
            ],
        },
    )
    out = probe.check()
    assert finding(out.findings, "retired_pages").action == Action.REPLACE
    assert finding(out.findings, "retired_pages_pending").component == "gpu1"


def test_nvlink_down_and_errors_growing(tmp_path: Path) -> None:
    links = [{"link": 0, "state": "up", "errors": 0}, {"link": 1, "state": "up", "errors": 5}]
    probe, path = make_probe(tmp_path, {"generate": 8, "gpus": [{"index": 6, "nvlink": links}]})
    assert probe.check().status == Status.OK
    links2 = [{"link": 0, "state": "down", "errors": 0}, {"link": 1, "state": "up", "errors": 9}]
    write(path, {"generate": 8, "gpus": [{"index": 6, "nvlink": links2}]})
    out = probe.check()
    down = finding(out.findings, "nvlink_down")
    assert (down.component, down.status, down.action) == ("gpu6", Status.FAIL, Action.RESET)
    grow = finding(out.findings, "nvlink_errors")
    assert grow.status == Status.WARN and "+4" in grow.message


def test_thermal_temperature_and_hw_slowdown(tmp_path: Path) -> None:
    probe, _ = make_probe(
        tmp_path,
        {
            "generate": 8,
            "gpus": [
                {"index": 0, "temperature": 95},
                {"index": 1, "throttle_reasons": ["hw_slowdown"]},
            ],
        },
    )
    out = probe.check()
    thermal = [f for f in out.findings if f.code == "thermal"]
    assert {f.component for f in thermal} == {"gpu0", "gpu1"}
    assert all(f.status == Status.WARN and f.action == Action.MONITOR for f in thermal)
    assert out.status == Status.WARN


def test_pcie_width_below_max_warns_gen_only_if_enabled(tmp_path: Path) -> None:
    gpus = [
        {"index": 0, "pcie": {"width": 8, "max_width": 16, "gen": 5, "max_gen": 5}},
        {"index": 1, "pcie": {"width": 16, "max_width": 16, "gen": 1, "max_gen": 5}},
    ]
    probe, _ = make_probe(tmp_path, {"generate": 8, "gpus": gpus})
    out = probe.check()
    assert [f.component for f in out.findings if f.code == "pcie_degraded"] == ["gpu0"]
    probe2, _ = make_probe(tmp_path, {"generate": 8, "gpus": gpus}, check_pcie_gen=True)
    assert len([f for f in probe2.check().findings if f.code == "pcie_degraded"]) == 2


def test_kernel_log_xid_maps_pci_to_gpu(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    probe, _ = make_probe(
        tmp_path,
        {"generate": 8, "gpus": [{"index": 3, "pci_bus_id": "00000000:3B:00.0"}]},
        kmsg_path=kmsg,
    )
    assert probe.check().status == Status.OK
    with kmsg.open("a") as fh:
        fh.write(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
        )
    f = finding(probe.check().findings, "xid79")
    assert (f.component, f.action, f.urgent) == ("gpu3", Action.REBOOT, True)


def test_same_xid_from_both_sources_counts_once(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE\n")
    probe, _ = make_probe(
        tmp_path,
        {
            "generate": 8,
            "gpus": [{"index": 3, "pci_bus_id": "0000:3b:00.0"}],
            "xid_events": [{"gpu": 3, "xid": 48}],
        },
        kmsg_path=kmsg,
    )
    probe.check()
    assert probe.xid_counts == {48: 1}


def test_unreadable_kernel_log_is_unknown_not_fail(tmp_path: Path) -> None:
    probe, _ = make_probe(tmp_path, {"generate": 8}, kmsg_path=tmp_path / "missing")
    out = probe.check()
    assert out.status == Status.UNKNOWN
    assert finding(out.findings, "source_error").component == "kmsg"


def test_config_fake_needs_scenario() -> None:
    with pytest.raises(ValidationError, match="fake_scenario"):
        GpuConfig(backend="fake")


def test_config_xid_keys_must_be_numbers() -> None:
    with pytest.raises(ValidationError, match="not a number"):
        GpuConfig.model_validate({"xid_actions": {"x13": "MONITOR"}})


def test_config_empty_kmsg_path_disables_kernel_log() -> None:
    assert GpuConfig.model_validate({"kmsg_path": ""}).kmsg_path is None
    assert GpuConfig().kmsg_path == Path("/dev/kmsg")
