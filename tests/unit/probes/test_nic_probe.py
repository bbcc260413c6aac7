"""The nic probe against small fake sysfs trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hyperpod_agent.health import Action, Status
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.nic import (
    NicConfig,
    NicProbe,
    netdev_is_up,
    parse_ib_rate,
    parse_ib_state,
)


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def netdev(
    root: Path,
    name: str,
    operstate: str = "up",
    carrier: int | None = 1,
    changes: int = 2,
    rx_errors: int = 0,
    tx_errors: int = 0,
) -> None:
    base = f"class/net/{name}"
    write(root, f"{base}/operstate", operstate)
    if carrier is not None:
        write(root, f"{base}/carrier", str(carrier))
    write(root, f"{base}/carrier_changes", str(changes))
    write(root, f"{base}/statistics/rx_errors", str(rx_errors))
    write(root, f"{base}/statistics/tx_errors", str(tx_errors))


def ib_port(
    root: Path,
    device: str = "mlx5_0",
    port: str = "1",
    state: str = "4: ACTIVE",
    phys: str = "5: LinkUp",
    rate: str = "400 Gb/sec (4X NDR)",
    symbol_error: int = 0,
    link_downed: int = 0,
) -> None:
    base = f"class/infiniband/{device}/ports/{port}"
    write(root, f"{base}/state", state)
    write(root, f"{base}/phys_state", phys)
    write(root, f"{base}/rate", rate)
    write(root, f"{base}/counters/symbol_error", str(symbol_error))
    write(root, f"{base}/counters/port_rcv_errors", "0")
    write(root, f"{base}/counters/link_downed", str(link_downed))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def probe(root: Path, clock: Clock | None = None, **cfg: object) -> NicProbe:
    ctx = ProbeContext(node_name="node1", sysfs_root=root)
    return NicProbe(NicConfig.model_validate(cfg), ctx, clock=clock or Clock())


# --- parsers -------------------------------------------------------------------------------


def test_parse_ib_state_strips_the_number() -> None:
    assert parse_ib_state("4: ACTIVE") == "ACTIVE"
    assert parse_ib_state("5: LinkUp") == "LinkUp"
    assert parse_ib_state("3: Disabled") == "Disabled"
    assert parse_ib_state(None) is None


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("400 Gb/sec (4X NDR)", 400.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("100 Gb/sec", 100.0),
        ("garbage", None),
        (None, None),
    ],
)
def test_parse_ib_rate(text: str | None, rate: float | None) -> None:
    assert parse_ib_rate(text) == rate


def test_netdev_is_up_needs_carrier_and_up_state() -> None:
    assert netdev_is_up("up", 1)
    assert netdev_is_up("unknown", 1)  # dummy and some virtual NICs
    assert not netdev_is_up("up", 0)
    assert not netdev_is_up("down", None)
    assert not netdev_is_up("lowerlayerdown", 0)
    assert not netdev_is_up("dormant", 1)


# --- healthy and absent hardware -----------------------------------------------------------


def test_no_ib_and_nothing_expected_is_ok(tmp_path: Path) -> None:
    out = probe(tmp_path).check()
    assert out.status is Status.OK
    assert "0 IB/EFA port(s)" in out.message


def test_healthy_interfaces_and_ports(tmp_path: Path) -> None:
    netdev(tmp_path, "eth0")
    ib_port(tmp_path)
    ib_port(tmp_path, device="efa_0", rate="100 Gb/sec")
    out = probe(tmp_path, interfaces=["eth0"], min_rate_gbps=100).check()
    assert out.status is Status.OK, out.message
    assert out.findings == []


def test_required_ib_absent_fails(tmp_path: Path) -> None:
    out = probe(tmp_path, require_ib=True).check()
    assert out.status is Status.FAIL
    assert out.findings[0].code == "nic_missing"


def test_expected_ib_device_absent_fails(tmp_path: Path) -> None:
    ib_port(tmp_path, device="mlx5_0")
    out = probe(tmp_path, ib_devices=["mlx5_0", "mlx5_1"]).check()
    assert out.status is Status.FAIL
    assert [(f.component, f.code) for f in out.findings] == [("mlx5_1", "nic_missing")]


def test_expected_interface_absent_fails(tmp_path: Path) -> None:
    out = probe(tmp_path, interfaces=["eth9"]).check()
    assert out.status is Status.FAIL
    assert out.findings[0].component == "eth9"
    assert out.findings[0].code == "nic_missing"


# --- link down -----------------------------------------------------------------------------


def test_interface_down_is_urgent_reboot(tmp_path: Path) -> None:
    netdev(tmp_path, "eth0", operstate="down", carrier=None)
    out = probe(tmp_path, interfaces=["eth0"]).check()
    assert out.status is Status.FAIL
    (finding,) = out.findings
    assert finding.code == "link_down"
    assert finding.action is Action.REBOOT
    assert finding.urgent
    assert "carrier off" in finding.message


def test_link_down_action_is_configurable(tmp_path: Path) -> None:
    netdev(tmp_path, "eth0", operstate="lowerlayerdown", carrier=0)
    out = probe(
        tmp_path, interfaces=["eth0"], link_down_action="MONITOR", link_down_urgent=False
    ).check()
    assert out.findings[0].action is Action.MONITOR
    assert not out.findings[0].urgent


def test_unlisted_interface_is_not_checked(tmp_path: Path) -> None:
    netdev(tmp_path, "eth1", operstate="down", carrier=0)
    assert probe(tmp_path).check().status is Status.OK


@pytest.mark.parametrize(
    ("state", "phys", "expect"),
    [("1: DOWN", "3: Disabled", "port state DOWN"), ("4: ACTIVE", "2: Polling", "Polling")],
)
def test_ib_port_not_active_fails(tmp_path: Path, state: str, phys: str, expect: str) -> None:
    # link_downed > 0: the kernel saw it up and go down since boot
    ib_port(tmp_path, state=state, phys=phys, link_downed=1)
    out = probe(tmp_path).check()
    assert out.status is Status.FAIL
    (finding,) = out.findings
    assert (finding.component, finding.code) == ("mlx5_0/1", "link_down")
    assert expect in finding.message
    assert finding.urgent


def test_efa_port_without_phys_state_is_judged_on_state(tmp_path: Path) -> None:
    base = "class/infiniband/efa_0/ports/1"
    write(tmp_path, f"{base}/state", "4: ACTIVE")
    assert probe(tmp_path).check().status is Status.OK


def test_rate_below_expected_warns(tmp_path: Path) -> None:
    ib_port(tmp_path, rate="200 Gb/sec (4X HDR)")
    out = probe(tmp_path, min_rate_gbps=400).check()
    assert out.status is Status.WARN
    assert out.findings[0].code == "rate_degraded"
    assert "200 Gb/s below expected 400" in out.findings[0].message


# --- counters ------------------------------------------------------------------------------


def test_ib_error_counter_growth_warns_after_baseline(tmp_path: Path) -> None:
    ib_port(tmp_path, symbol_error=50)
    p = probe(tmp_path)
    assert p.check().status is Status.OK  # first run only records the baseline
    ib_port(tmp_path, symbol_error=57)
    out = p.check()
    assert out.status is Status.WARN
    assert out.findings[0].code == "nic_errors"
    assert "symbol_error +7" in out.findings[0].message
    assert p.check().status is Status.OK  # no further growth


def test_error_delta_threshold(tmp_path: Path) -> None:
    ib_port(tmp_path, symbol_error=0)
    p = probe(tmp_path, error_delta_warn=10)
    p.check()
    ib_port(tmp_path, symbol_error=9)
    assert p.check().status is Status.OK


def test_counter_reset_is_not_growth(tmp_path: Path) -> None:
    netdev(tmp_path, "eth0", rx_errors=100)
    p = probe(tmp_path, interfaces=["eth0"])
    p.check()
    netdev(tmp_path, "eth0", rx_errors=3)
    assert p.check().status is Status.OK


def test_netdev_error_growth_warns(tmp_path: Path) -> None:
    netdev(tmp_path, "eth0")
    p = probe(tmp_path, interfaces=["eth0"])
    p.check()
    netdev(tmp_path, "eth0", tx_errors=4)
    out = p.check()
    assert out.status is Status.WARN
    assert "tx_errors +4" in out.message


def test_carrier_flaps_warn_then_fail_within_window(tmp_path: Path) -> None:
    clock = Clock()
    netdev(tmp_path, "eth0", changes=2)
    p = probe(tmp_path, clock, interfaces=["eth0"], flap_strikes=3, flap_window_s=60)
    p.check()
    codes = []
    for changes in (4, 6, 8):
        clock.now += 10
        netdev(tmp_path, "eth0", changes=changes)
        codes.append(p.check().findings[0].code)
    assert codes == ["link_flap", "link_flap", "link_flapping"]
    out = p.check()
    assert out.status is Status.OK  # no new flap this run


def test_flaps_outside_window_do_not_accumulate(tmp_path: Path) -> None:
    clock = Clock()
    ib_port(tmp_path, link_downed=0)
    p = probe(tmp_path, clock, flap_strikes=2, flap_window_s=60)
    p.check()
    for downed in (1, 2, 3):
        clock.now += 100
        ib_port(tmp_path, link_downed=downed)
        out = p.check()
        assert out.status is Status.WARN
        assert out.findings[0].code == "link_flap"


def test_ib_link_downed_flapping_fails(tmp_path: Path) -> None:
    clock = Clock()
    ib_port(tmp_path, link_downed=0)
    p = probe(tmp_path, clock, flap_strikes=2)
    p.check()
    ib_port(tmp_path, link_downed=1)
    p.check()
    ib_port(tmp_path, link_downed=2)
    out = p.check()
    assert out.status is Status.FAIL
    assert out.findings[0].code == "link_flapping"
    assert out.findings[0].action is Action.REBOOT


# --- errors and config ---------------------------------------------------------------------


def test_unreadable_sysfs_raises_for_the_runner(tmp_path: Path) -> None:
    (tmp_path / "class/net/eth0/operstate").mkdir(parents=True)  # a directory: read fails
    with pytest.raises(OSError):
        probe(tmp_path, interfaces=["eth0"]).check()


@pytest.mark.parametrize(
    "cfg",
    [
        {"interfaces": ["eth0", "eth0"]},
        {"ib_devices": ["mlx5/0"]},
        {"flap_strikes": 0},
        {"min_rate_gbps": 0},
        {"unknown_key": 1},
    ],
)
def test_config_rejects_bad_values(cfg: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        NicConfig.model_validate(cfg)


def test_config_defaults() -> None:
    cfg = NicConfig()
    assert cfg.interfaces == [] and not cfg.require_ib
    assert cfg.link_down_action is Action.REBOOT and cfg.link_down_urgent


def test_recovery_from_a_seen_outage_is_ok_not_a_flap(tmp_path: Path) -> None:
    netdev(tmp_path, "eth0", changes=2)
    p = probe(tmp_path, interfaces=["eth0"])
    assert p.check().status is Status.OK
    netdev(tmp_path, "eth0", operstate="lowerlayerdown", carrier=0, changes=3)
    assert [f.code for f in p.check().findings] == ["link_down"]
    assert p.check().findings[0].code == "link_down"  # still down: FAIL every run
    netdev(tmp_path, "eth0", changes=4)
    assert p.check().status is Status.OK


def test_seen_outages_count_as_flap_strikes(tmp_path: Path) -> None:
    clock = Clock()
    netdev(tmp_path, "eth0", changes=2)
    p = probe(tmp_path, clock, interfaces=["eth0"], flap_strikes=3, flap_window_s=600)
    p.check()
    for changes in (3, 5):  # two outages seen down, then recovered
        clock.now += 10
        netdev(tmp_path, "eth0", operstate="down", carrier=None, changes=changes)
        assert p.check().status is Status.FAIL
        clock.now += 10
        netdev(tmp_path, "eth0", changes=changes + 1)
        assert p.check().status is Status.OK
    clock.now += 10
    netdev(tmp_path, "eth0", changes=8)  # a third flap, between two runs
    out = p.check()
    assert out.findings[0].code == "link_flapping"


def test_ib_port_down_then_active_again(tmp_path: Path) -> None:
    ib_port(tmp_path)
    p = probe(tmp_path)
    p.check()
    ib_port(tmp_path, state="1: DOWN", phys="2: Polling", link_downed=1)
    assert p.check().status is Status.FAIL
    ib_port(tmp_path, link_downed=1)
    assert p.check().status is Status.OK
