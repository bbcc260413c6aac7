"""The one interface between the gpu probe and where GPU facts come from.

Two backends implement it: ``_nvml.NvmlBackend`` (the real one; the only module that
imports pynvml) and ``_fake_nvml.FakeBackend`` (a JSON scenario file, for drills and
tests). Every field a GPU does not support is ``None``: the probe skips it instead of
failing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class NvLink:
    """One NVLink of one GPU. ``up``/``errors`` are None when not supported."""

    link: int
    up: bool | None = None
    errors: int | None = None  # sum of the DL error counters (replay, recovery, CRC)


@dataclass(frozen=True)
class GpuState:
    """What a backend read from one GPU in one sample."""

    index: int
    uuid: str | None = None
    name: str | None = None  # the model, as NVML names it: "NVIDIA H100 80GB HBM3"
    pci_bus_id: str | None = None
    lost: bool = False
    errors: tuple[str, ...] = ()  # NVML failures other than "not supported"
    temperature_c: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    retired_pages: int | None = None  # double-bit-error retired pages (pre-Ampere GPUs)
    retired_pages_pending: bool | None = None
    nvlinks: tuple[NvLink, ...] = ()
    throttle_reasons: frozenset[str] | None = None  # hw_slowdown, hw_thermal, hw_power_brake
    pcie_width: int | None = None
    pcie_max_width: int | None = None
    pcie_gen: int | None = None
    pcie_max_gen: int | None = None

    @property
    def component(self) -> str:
        return f"gpu{self.index}"


@dataclass(frozen=True)
class XidEvent:
    """One XID reported by NVML's event set or a fake scenario."""

    gpu: int | None  # index; None when the device could not be mapped
    xid: int
    message: str = ""


@dataclass
class GpuSample:
    """One read of every GPU, plus the XID events that arrived since the last sample.

    ``error`` is set when the backend could not read anything (NVML not initialised,
    invalid scenario with nothing to fall back on): the probe reports UNKNOWN.
    ``warnings`` are problems of the checking machinery (an invalid scenario edit
    while the previous one is kept) that the probe reports as UNKNOWN findings.
    """

    gpus: list[GpuState] = field(default_factory=list)
    events: list[XidEvent] = field(default_factory=list)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)


class GpuBackend(Protocol):
    """Where GPU facts come from."""

    def sample(self) -> GpuSample:
        """Read every GPU now and return the events seen since the last call."""
        ...

    def close(self) -> None:
        """Release handles (NVML shutdown, event sets)."""
        ...
