"""The nic probe: a port that has not been up since boot is not a fault; one that was
up and went down is, whoever saw it up (this run, an earlier agent of this boot, the
kernel's counters); a port the config or the baseline expects up always is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.health import Action, Status
from hyperpod_agent.probes._links import SEEN_UP_FILE, SeenUp, netdev_was_up
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.baseline import BaselineSource
from hyperpod_agent.probes.nic import IbPort, NicConfig, NicProbe, kernel_saw_up

DOWN: dict[str, Any] = {"state": "1: DOWN", "phys": "3: Disabled"}
POLLING: dict[str, Any] = {"state": "1: DOWN", "phys": "2: Polling"}


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def ib_port(
    sys: Path,
    device: str = "mlx5_0",
    port: str = "1",
    state: str = "4: ACTIVE",
    phys: str = "5: LinkUp",
    link_downed: int | None = 0,
) -> None:
    base = f"class/infiniband/{device}/ports/{port}"
    write(sys, f"{base}/state", state)
    write(sys, f"{base}/phys_state", phys)
    write(sys, f"{base}/rate", "400 Gb/sec (4X NDR)")
    if link_downed is not None:
        write(sys, f"{base}/counters/link_downed", str(link_downed))


def port_netdev(
    sys: Path,
    device: str,
    name: str,
    up_count: int | None,
    changes: int = 1,
    dev_port: int | None = None,
) -> None:
    base = f"class/infiniband/{device}/device/net/{name}"
    if up_count is not None:
        write(sys, f"{base}/carrier_up_count", str(up_count))
    write(sys, f"{base}/carrier_changes", str(changes))
    if dev_port is not None:
        write(sys, f"{base}/dev_port", str(dev_port))


def boot(proc: Path, boot_id: str) -> None:
    write(proc, "sys/kernel/random/boot_id", boot_id)


def ctx(tmp_path: Path, state: bool = True, baseline: Path | None = None) -> ProbeContext:
    return ProbeContext(
        node_name="node1",
        sysfs_root=tmp_path / "sys",
        procfs_root=tmp_path / "proc",
        state_dir=tmp_path / "run" if state else None,
        baseline=BaselineSource(baseline, "node1") if baseline else None,
    )


def probe(tmp_path: Path, state: bool = True, baseline: Path | None = None, **cfg: object):  # type: ignore[no-untyped-def]
    (tmp_path / "run").mkdir(exist_ok=True)
    return NicProbe(NicConfig.model_validate(cfg), ctx(tmp_path, state, baseline))


# --- pure --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("up_count", "changes", "was_up"),
    [
        (0, 1, False),  # the driver turned the carrier off once at start: never up
        (1, 2, True),
        (0, 7, False),  # carrier_up_count is the authority when the kernel has it
        (None, 0, False),
        (None, 1, False),  # older kernels: one change is the driver's start
        (None, 2, True),
        (None, None, False),
    ],
)
def test_netdev_was_up(up_count: int | None, changes: int | None, was_up: bool) -> None:
    assert netdev_was_up(up_count, changes) is was_up


def test_kernel_saw_up_from_link_downed_or_a_netdev() -> None:
    port = IbPort("mlx5_0", "1", "DOWN", "Disabled", None, {"link_downed": 0})
    assert not kernel_saw_up(port)
    assert kernel_saw_up(IbPort("mlx5_0", "1", "DOWN", "Disabled", None, {"link_downed": 2}))
    assert kernel_saw_up(IbPort("mlx5_0", "1", "DOWN", "Disabled", None, {}, netdevs_up=True))


# --- never up: not a fault ------------------------------------------------------------------


def test_second_port_never_cabled_is_ok(tmp_path: Path) -> None:
    ib_port(tmp_path / "sys", "mlx5_0")
    ib_port(tmp_path / "sys", "mlx5_1", **DOWN)
    out = probe(tmp_path).check()
    assert out.status is Status.OK, out
    assert "1 IB/EFA port(s) ok" in out.message
    assert "never up since boot (mlx5_1/1)" in out.message


def test_roce_port_never_up_with_its_netdev_is_ok(tmp_path: Path) -> None:
    ib_port(tmp_path / "sys", "mlx5_1", **DOWN, link_downed=None)
    port_netdev(tmp_path / "sys", "mlx5_1", "enp1s0f1", up_count=0, changes=1)
    assert probe(tmp_path).check().status is Status.OK


def test_port_still_training_after_boot_is_ok_then_checked_once_up(tmp_path: Path) -> None:
    sys = tmp_path / "sys"
    ib_port(sys, **POLLING)
    p = probe(tmp_path)
    assert p.check().status is Status.OK  # not up yet: no fault, no flap strike
    ib_port(sys)
    assert p.check().status is Status.OK
    ib_port(sys, **POLLING)  # up once, now down: the fault it always was
    out = p.check()
    assert out.status is Status.FAIL
    (finding,) = out.findings
    assert (finding.component, finding.code) == ("mlx5_0/1", "link_down")
    assert finding.action is Action.REBOOT and finding.urgent


# --- was up, went down: a fault -----------------------------------------------------------


def test_kernel_counter_says_it_was_up(tmp_path: Path) -> None:
    ib_port(tmp_path / "sys", **DOWN, link_downed=1)
    out = probe(tmp_path).check()
    assert [f.code for f in out.findings] == ["link_down"]


@pytest.mark.parametrize(("dev_port", "fails"), [(0, True), (1, False), (None, True)])
def test_netdev_of_the_port_had_carrier(tmp_path: Path, dev_port: int | None, fails: bool) -> None:
    # an mlx4-style two-port device: dev_port numbers the ports from 0
    ib_port(tmp_path / "sys", **DOWN, link_downed=None)
    port_netdev(tmp_path / "sys", "mlx5_0", "ib0", up_count=1, changes=2, dev_port=dev_port)
    assert (probe(tmp_path).check().status is Status.FAIL) is fails


def test_agent_restart_remembers_a_port_seen_up_this_boot(tmp_path: Path) -> None:
    sys, proc = tmp_path / "sys", tmp_path / "proc"
    boot(proc, "boot-a")
    ib_port(sys)  # no counter will show the outage (an administrative port disable)
    assert probe(tmp_path).check().status is Status.OK
    saved = json.loads((tmp_path / "run" / SEEN_UP_FILE).read_text())
    assert saved == {"boot_id": "boot-a", "up": ["mlx5_0/1"]}
    ib_port(sys, **DOWN)
    restarted = probe(tmp_path)  # a new agent process, same boot
    assert [f.code for f in restarted.check().findings] == ["link_down"]


def test_memory_of_another_boot_counts_for_nothing(tmp_path: Path) -> None:
    sys, proc = tmp_path / "sys", tmp_path / "proc"
    boot(proc, "boot-a")
    ib_port(sys)
    probe(tmp_path).check()
    boot(proc, "boot-b")  # rebooted; the state directory was not a tmpfs
    ib_port(sys, **DOWN)
    assert probe(tmp_path).check().status is Status.OK


def test_without_a_state_dir_the_process_still_remembers(tmp_path: Path) -> None:
    ib_port(tmp_path / "sys")
    p = probe(tmp_path, state=False)
    p.check()
    ib_port(tmp_path / "sys", **DOWN)
    assert p.check().status is Status.FAIL
    assert not (tmp_path / "run" / SEEN_UP_FILE).exists()


def test_unwritable_state_is_logged_once_and_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen = SeenUp(tmp_path / "absent", "b")
    seen.add("mlx5_0/1")
    seen.add("mlx5_1/1")
    assert "mlx5_0/1" in seen and "mlx5_1/1" in seen
    assert len([r for r in caplog.records if "couldn't keep" in r.message]) == 1


@pytest.mark.parametrize("text", ["", "{", "[]", '{"boot_id": "b"}', '{"boot_id": "b", "up": 3}'])
def test_unusable_state_file_starts_afresh(tmp_path: Path, text: str) -> None:
    (tmp_path / SEEN_UP_FILE).write_text(text)
    assert "mlx5_0/1" not in SeenUp(tmp_path, "b")


# --- expected up: a fault whenever down ---------------------------------------------------


def test_configured_port_down_fails_even_if_never_up(tmp_path: Path) -> None:
    ib_port(tmp_path / "sys", **DOWN)
    out = probe(tmp_path, ib_ports=["mlx5_0/1"]).check()
    assert [f.code for f in out.findings] == ["link_down"]


def test_configured_port_absent_is_missing(tmp_path: Path) -> None:
    ib_port(tmp_path / "sys")
    out = probe(tmp_path, ib_ports=["mlx5_0/1", "mlx5_1/1"]).check()
    assert [(f.component, f.code) for f in out.findings] == [("mlx5_1/1", "nic_missing")]


@pytest.mark.parametrize("ports", [["mlx5_0"], ["mlx5_0/x"], ["/1"], ["mlx5_0/1", "mlx5_0/1"]])
def test_ib_ports_config_is_validated(ports: list[str]) -> None:
    with pytest.raises(ValueError, match="ib_ports"):
        NicConfig(ib_ports=ports)


def baseline_file(tmp_path: Path, ports: list[str], interfaces: list[str] = []) -> Path:  # noqa: B006
    path = tmp_path / "baseline.toml"
    path.write_text(
        f'version = 1\nnode = "node1"\n[nic]\nports = {json.dumps(ports)}\n'
        f"interfaces = {json.dumps(interfaces)}\n"
    )
    return path


def test_baseline_port_down_fails_others_do_not(tmp_path: Path) -> None:
    sys = tmp_path / "sys"
    ib_port(sys, "mlx5_0", **DOWN)
    ib_port(sys, "mlx5_1", **DOWN)
    out = probe(tmp_path, baseline=baseline_file(tmp_path, ["mlx5_0/1"])).check()
    assert [(f.component, f.code) for f in out.findings] == [("mlx5_0/1", "link_down")]


def test_baseline_port_gone_and_interface_down(tmp_path: Path) -> None:
    sys = tmp_path / "sys"
    ib_port(sys, "mlx5_0")
    write(sys, "class/net/eth0/operstate", "down")
    write(sys, "class/net/eth0/carrier", "0")
    path = baseline_file(tmp_path, ["mlx5_0/1", "mlx5_3/1"], ["eth0"])
    out = probe(tmp_path, baseline=path).check()
    assert sorted((f.component, f.code) for f in out.findings) == [
        ("eth0", "link_down"),
        ("mlx5_3/1", "nic_missing"),
    ]


def test_malformed_baseline_leaves_the_probe_running_without_it(tmp_path: Path) -> None:
    ib_port(tmp_path / "sys", **DOWN)
    path = tmp_path / "baseline.toml"
    path.write_text("version = 1\nnode = 'node1'\n[nic]\nports = 'mlx5_0/1'\n")
    assert probe(tmp_path, baseline=path).check().status is Status.OK
