"""The nic probe: network interfaces and InfiniBand/EFA ports.

Reads ``/sys/class/net/<if>`` for the interfaces the config names and every port
under ``/sys/class/infiniband`` (EFA devices appear there too). A link that is down
on a GPU node stalls every collective of the job running there, so ``link_down`` is
FAIL, REBOOT and urgent by default: the controller requeues the job at once instead
of waiting for NCCL to time out.

Only a link that was up and went down is a fault. A port found down that has not been
up since boot (a second port never cabled, one the site does not use) is left alone
until it comes up. "Up since boot" is what the probe saw (kept in the state directory
across agent restarts, per boot) or what the kernel counted: the port's
``link_downed`` counter, or ``carrier_up_count`` of its netdev. Ports and interfaces
the config or the node's baseline expect up are faults whenever they are down.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field, model_validator

from hyperpod_agent.health import Action, Finding, Status
from hyperpod_agent.probes._baseline import baseline_of
from hyperpod_agent.probes._links import SeenUp, netdev_was_up, read_boot_id
from hyperpod_agent.probes._sysfs import CounterTracker, list_dir, read_int, read_text, under
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig, ProbeContext

DEFAULT_IB_COUNTERS = [
    "symbol_error",
    "port_rcv_errors",
    "link_error_recovery",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
]
NETDEV_ERROR_COUNTERS = ["rx_errors", "tx_errors"]


class NicConfig(ProbeConfig):
    """``[probes.nic]``. By default every IB/EFA port found is checked and no
    Ethernet interface is required; a node without IB is OK unless ``require_ib``."""

    interfaces: list[str] = Field(default_factory=list, description="netdevs that must be up")
    ib_devices: list[str] = Field(default_factory=list, description="IB/EFA devices required")
    ib_ports: list[str] = Field(
        default_factory=list, description="IB/EFA ports that must be up: mlx5_0/1"
    )
    require_ib: bool = False
    min_rate_gbps: float | None = Field(default=None, gt=0)
    ib_error_counters: list[str] = Field(default_factory=lambda: list(DEFAULT_IB_COUNTERS))
    error_delta_warn: int = Field(default=1, ge=1, description="counter growth per run to warn")
    flap_strikes: int = Field(default=3, ge=1, le=100)
    flap_window_s: float = Field(default=300.0, gt=0)
    link_down_action: Action = Action.REBOOT
    link_down_urgent: bool = True

    @model_validator(mode="after")
    def _unique_names(self) -> NicConfig:
        for key in ("interfaces", "ib_devices"):
            names: list[str] = getattr(self, key)
            if len(set(names)) != len(names):
                raise ValueError(f"{key}: duplicate names in {names}")
            if any(not n or "/" in n for n in names):
                raise ValueError(f"{key}: expected plain device names, got {names}")
        if len(set(self.ib_ports)) != len(self.ib_ports):
            raise ValueError(f"ib_ports: duplicate names in {self.ib_ports}")
        for name in self.ib_ports:
            device, _, port = name.partition("/")
            if not device or not port.isdigit():
                raise ValueError(
                    f"ib_ports: expected <device>/<port> such as mlx5_0/1, got {name!r}"
                )
        return self


@dataclass(frozen=True)
class NetdevState:
    name: str
    operstate: str
    carrier: int | None
    carrier_changes: int | None
    errors: dict[str, int] = field(default_factory=dict)
    carrier_up_count: int | None = None


@dataclass(frozen=True)
class IbPort:
    device: str
    port: str
    state: str | None
    phys_state: str | None
    rate_gbps: float | None
    counters: dict[str, int] = field(default_factory=dict)
    netdevs_up: bool = False  # a netdev of the port had carrier since it was registered

    @property
    def component(self) -> str:
        return f"{self.device}/{self.port}"


def ib_port_down(port: IbPort) -> str | None:
    """Why ``port`` does not carry traffic, or None when it is up."""
    if port.state is not None and port.state.upper() != "ACTIVE":
        return f"port state {port.state}"
    if port.phys_state is not None and port.phys_state != "LinkUp":
        return f"physical state {port.phys_state}"
    return None


def kernel_saw_up(port: IbPort) -> bool:
    """Kernel evidence that ``port`` was up since boot: the link went down at least
    once (``link_downed`` counts LinkUp -> down), or a netdev of it had carrier."""
    return port.counters.get("link_downed", 0) > 0 or port.netdevs_up


def parse_ib_state(text: str | None) -> str | None:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; ``"5: LinkUp"`` -> ``"LinkUp"``."""
    if text is None:
        return None
    return text.split(":", 1)[-1].strip() or None


_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


def parse_ib_rate(text: str | None) -> float | None:
    """``"100 Gb/sec (4X EDR)"`` -> 100.0; None when absent or unreadable."""
    if text is None:
        return None
    match = _RATE.match(text)
    return float(match.group(1)) if match else None


def netdev_is_up(operstate: str, carrier: int | None) -> bool:
    """A netdev carries traffic when its carrier is on and its operstate is up.

    Drivers without operstate support (dummy, some virtual NICs) say ``unknown``;
    their carrier decides.
    """
    return operstate in ("up", "unknown") and carrier == 1


def read_netdev(sysfs_root: Path, name: str) -> NetdevState | None:
    """State of ``/sys/class/net/<name>``, or None when the interface is absent."""
    base = under(sysfs_root, "/class/net") / name
    operstate = read_text(base / "operstate")
    if operstate is None:
        return None
    errors = {}
    for counter in NETDEV_ERROR_COUNTERS:
        value = read_int(base / "statistics" / counter)
        if value is not None:
            errors[counter] = value
    return NetdevState(
        name=name,
        operstate=operstate,
        carrier=read_int(base / "carrier"),
        carrier_changes=read_int(base / "carrier_changes"),
        errors=errors,
        carrier_up_count=read_int(base / "carrier_up_count"),
    )


def _port_netdevs_up(device_dir: Path, port: str) -> bool:
    """Whether a netdev of ``port`` (IPoIB ``ib0``, a RoCE port's Ethernet netdev) had
    carrier since it was registered. A netdev's ``dev_port`` numbers the ports of its
    device from 0; one without it belongs to every port of a single-port device."""
    net = device_dir / "device" / "net"
    for name in list_dir(net):
        base = net / name
        dev_port = read_int(base / "dev_port")
        if dev_port is not None and str(dev_port + 1) != port:
            continue
        if netdev_was_up(read_int(base / "carrier_up_count"), read_int(base / "carrier_changes")):
            return True
    return False


def read_ib_ports(sysfs_root: Path, counters: list[str]) -> list[IbPort]:
    """Every port of every device under ``/sys/class/infiniband``."""
    ports = []
    ib_root = under(sysfs_root, "/class/infiniband")
    for device in list_dir(ib_root):
        for port in list_dir(ib_root / device / "ports"):
            base = ib_root / device / "ports" / port
            values = {}
            for counter in [*counters, "link_downed"]:
                value = read_int(base / "counters" / counter)
                if value is not None:
                    values[counter] = value
            ports.append(
                IbPort(
                    device=device,
                    port=port,
                    state=parse_ib_state(read_text(base / "state")),
                    phys_state=parse_ib_state(read_text(base / "phys_state")),
                    rate_gbps=parse_ib_rate(read_text(base / "rate")),
                    counters=values,
                    netdevs_up=_port_netdevs_up(ib_root / device, port),
                )
            )
    return ports


class NicProbe(Probe[NicConfig]):
    name = "nic"
    config_model = NicConfig

    def __init__(
        self, config: NicConfig, context: ProbeContext, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(config, context)
        self._clock = clock
        self._counters = CounterTracker()
        self._flaps: dict[str, deque[float]] = {}
        self._down_seen: set[str] = set()
        self._seen_up = SeenUp(context.state_dir, read_boot_id(context.procfs_root))

    def check(self) -> Outcome:
        """Check the expected interfaces and the IB/EFA ports once."""
        cfg = self.config
        baseline = baseline_of(self.context.baseline)
        interfaces = list(cfg.interfaces)
        expected_ports = set(cfg.ib_ports)
        if baseline is not None:
            interfaces += [i for i in baseline.nic.interfaces if i not in interfaces]
            expected_ports |= set(baseline.nic.ports)
        findings: list[Finding] = []
        for name in interfaces:
            state = read_netdev(self.context.sysfs_root, name)
            if state is None:
                findings.append(self._down(name, "nic_missing", "interface not present"))
                continue
            findings.extend(self._check_netdev(state))
        ports = read_ib_ports(self.context.sysfs_root, cfg.ib_error_counters)
        present = {p.device for p in ports}
        for device in cfg.ib_devices:
            if device not in present:
                findings.append(self._down(device, "nic_missing", "IB/EFA device not present"))
        if cfg.require_ib and not ports:
            findings.append(self._down("infiniband", "nic_missing", "no IB/EFA port found"))
        for comp in sorted(expected_ports - {p.component for p in ports}):
            findings.append(self._down(comp, "nic_missing", "IB/EFA port not present"))
        idle = []
        for port in ports:
            comp = port.component
            if ib_port_down(port) is None:
                self._seen_up.add(comp)
            elif comp not in expected_ports and not self._was_up(port):
                idle.append(comp)  # never cabled, or unused: not a fault until it is up
                continue
            findings.extend(self._check_ib_port(port))
        counted = f"{len(interfaces)} interface(s), {len(ports) - len(idle)} IB/EFA port(s) ok"
        if idle:
            counted += f", {len(idle)} never up since boot ({', '.join(idle)})"
        return Outcome.from_findings(findings, ok_message=counted)

    def _was_up(self, port: IbPort) -> bool:
        return port.component in self._seen_up or kernel_saw_up(port)

    def _check_netdev(self, state: NetdevState) -> list[Finding]:
        down = None
        if not netdev_is_up(state.operstate, state.carrier):
            carrier = state.carrier if state.carrier is not None else "off"
            down = f"link down (operstate {state.operstate}, carrier {carrier})"
        findings = self._link(state.name, down, "carrier_changes", state.carrier_changes)
        if down is None:
            findings.extend(self._errors(state.name, state.errors))
        return findings

    def _check_ib_port(self, port: IbPort) -> list[Finding]:
        comp = port.component
        down = ib_port_down(port)
        findings = self._link(comp, down, "link_downed", port.counters.get("link_downed"))
        if down is not None:
            return findings
        minimum = self.config.min_rate_gbps
        if minimum is not None and port.rate_gbps is not None and port.rate_gbps < minimum:
            findings.append(
                Finding(
                    component=comp,
                    code="rate_degraded",
                    status=Status.WARN,
                    action=Action.MONITOR,
                    message=f"rate {port.rate_gbps:g} Gb/s below expected {minimum:g} Gb/s",
                )
            )
        errors = {k: v for k, v in port.counters.items() if k != "link_downed"}
        findings.extend(self._errors(comp, errors))
        return findings

    def _link(self, comp: str, down: str | None, counter: str, value: int | None) -> list[Finding]:
        """``link_down`` while ``down`` says why; otherwise judge flaps from ``counter``.

        A down link seen by a run counts one flap strike; its recovery, also seen, is
        not counted again, so a link that went down and came back reads OK at once.
        """
        grew = self._counters.delta(f"{comp}:{counter}", value) if value is not None else 0
        if down is not None:
            if comp not in self._down_seen:
                self._down_seen.add(comp)
                self._strikes(comp).append(self._clock())
            return [self._down(comp, "link_down", down)]
        if comp in self._down_seen:
            self._down_seen.discard(comp)
            return []
        return self._flap(comp, grew, counter.replace("_", " "))

    def _strikes(self, comp: str) -> deque[float]:
        """Flap strikes of ``comp`` within the window (older ones dropped)."""
        now = self._clock()
        strikes = self._flaps.setdefault(comp, deque())
        while strikes and now - strikes[0] > self.config.flap_window_s:
            strikes.popleft()
        return strikes

    def _errors(self, comp: str, counters: dict[str, int]) -> list[Finding]:
        grown = {}
        for counter, value in counters.items():
            delta = self._counters.delta(f"{comp}:{counter}", value)
            if delta >= self.config.error_delta_warn:
                grown[counter] = delta
        if not grown:
            return []
        text = ", ".join(f"{k} +{v}" for k, v in sorted(grown.items()))
        return [
            Finding(
                component=comp,
                code="nic_errors",
                status=Status.WARN,
                action=Action.MONITOR,
                message=f"error counters growing: {text}",
            )
        ]

    def _flap(self, comp: str, grew: int, what: str) -> list[Finding]:
        """Count a strike for every run in which the link went down and back up;
        ``flap_strikes`` strikes within ``flap_window_s`` make it FAIL."""
        strikes = self._strikes(comp)
        if grew <= 0:
            return []
        strikes.append(self._clock())
        window = f"{len(strikes)} in {self.config.flap_window_s:g}s"
        if len(strikes) >= self.config.flap_strikes:
            return [
                Finding(
                    component=comp,
                    code="link_flapping",
                    status=Status.FAIL,
                    action=Action.REBOOT,
                    message=f"link flapping: {what} +{grew} ({window})",
                )
            ]
        return [
            Finding(
                component=comp,
                code="link_flap",
                status=Status.WARN,
                action=Action.MONITOR,
                message=f"link flapped: {what} +{grew} ({window})",
            )
        ]

    def _down(self, comp: str, code: str, message: str) -> Finding:
        return Finding(
            component=comp,
            code=code,
            status=Status.FAIL,
            action=self.config.link_down_action,
            urgent=self.config.link_down_urgent,
            message=message,
        )
