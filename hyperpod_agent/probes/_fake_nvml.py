"""A GPU backend driven by a JSON scenario file (``gpu.backend = "fake"``).

The file is re-read whenever its mtime or size changes, so a drill can inject a fault
into a running agent by editing it. An invalid edit is logged and reported, and the
previous scenario stays in force. The format is documented in docs/agent.md.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hyperpod_agent.probes.gpu_backend import GpuSample, GpuState, NvLink, XidEvent

log = logging.getLogger(__name__)

NS = Literal["not_supported"]
DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Ecc(_Strict):
    volatile: int | NS = 0
    aggregate: int | NS = 0


class _RowRemap(_Strict):
    pending: bool | NS = False
    failure: bool | NS = False


class _RetiredPages(_Strict):
    count: int | NS = 0
    pending: bool | NS = False


class _NvLink(_Strict):
    link: int = Field(ge=0)
    state: Literal["up", "down"] | NS = "up"
    errors: int | NS = 0


class _Pcie(_Strict):
    width: int | NS = 16
    max_width: int | NS = 16
    gen: int | NS = 5
    max_gen: int | NS = 5


class _Gpu(_Strict):
    index: int = Field(ge=0, lt=64)
    uuid: str | None = None
    name: str = Field(default=DEFAULT_MODEL, min_length=1, max_length=96)
    pci_bus_id: str | None = None
    lost: bool = False
    nvml_error: str | None = None
    temperature: int | NS = 40
    ecc: _Ecc | NS = Field(default_factory=_Ecc)
    row_remap: _RowRemap | NS = Field(default_factory=_RowRemap)
    retired_pages: _RetiredPages | NS = "not_supported"
    nvlink: list[_NvLink] | NS = Field(default_factory=list)
    throttle_reasons: list[Literal["hw_slowdown", "hw_thermal", "hw_power_brake"]] | NS = Field(
        default_factory=list
    )
    pcie: _Pcie | NS = Field(default_factory=_Pcie)


class _Event(_Strict):
    gpu: int | None = None
    xid: int = Field(ge=0)
    message: str = ""
    id: str | None = None


class Scenario(_Strict):
    """The scenario file's schema."""

    generate: int = Field(default=0, ge=0, le=64, description="healthy GPUs 0..N-1")
    gpus: list[_Gpu] = Field(default_factory=list)
    xid_events: list[_Event] = Field(default_factory=list)
    nvml_error: str | None = None


def _ns(value: object) -> object | None:
    return None if value == "not_supported" else value


def _gpu_state(g: _Gpu) -> GpuState:
    ecc = g.ecc if isinstance(g.ecc, _Ecc) else None
    remap = g.row_remap if isinstance(g.row_remap, _RowRemap) else None
    pages = g.retired_pages if isinstance(g.retired_pages, _RetiredPages) else None
    pcie = g.pcie if isinstance(g.pcie, _Pcie) else None
    links = g.nvlink if isinstance(g.nvlink, list) else []
    return GpuState(
        index=g.index,
        uuid=g.uuid or f"GPU-fake-{g.index:04d}",
        name=g.name,
        pci_bus_id=g.pci_bus_id or f"00000000:{0x10 + g.index:02X}:00.0",
        lost=g.lost,
        errors=(g.nvml_error,) if g.nvml_error else (),
        temperature_c=_ns(g.temperature),  # type: ignore[arg-type]
        ecc_volatile_uncorrected=_ns(ecc.volatile) if ecc else None,  # type: ignore[arg-type]
        ecc_aggregate_uncorrected=_ns(ecc.aggregate) if ecc else None,  # type: ignore[arg-type]
        row_remap_pending=_ns(remap.pending) if remap else None,  # type: ignore[arg-type]
        row_remap_failure=_ns(remap.failure) if remap else None,  # type: ignore[arg-type]
        retired_pages=_ns(pages.count) if pages else None,  # type: ignore[arg-type]
        retired_pages_pending=_ns(pages.pending) if pages else None,  # type: ignore[arg-type]
        nvlinks=tuple(
            NvLink(
                link=n.link,
                up=None if n.state == "not_supported" else n.state == "up",
                errors=_ns(n.errors),  # type: ignore[arg-type]
            )
            for n in links
        ),
        throttle_reasons=(
            frozenset(g.throttle_reasons) if isinstance(g.throttle_reasons, list) else None
        ),
        pcie_width=_ns(pcie.width) if pcie else None,  # type: ignore[arg-type]
        pcie_max_width=_ns(pcie.max_width) if pcie else None,  # type: ignore[arg-type]
        pcie_gen=_ns(pcie.gen) if pcie else None,  # type: ignore[arg-type]
        pcie_max_gen=_ns(pcie.max_gen) if pcie else None,  # type: ignore[arg-type]
    )


def parse_scenario(text: str) -> Scenario:
    """Parse and validate a scenario; ValueError with the key path on bad input."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc}") from None
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ValueError(f"{where}: {err['msg']}{more}") from None


def scenario_gpus(scenario: Scenario) -> list[GpuState]:
    """The GPUs a scenario describes: ``generate`` healthy ones, overridden by index."""
    by_index = {i: _Gpu(index=i) for i in range(scenario.generate)}
    by_index.update({g.index: g for g in scenario.gpus})
    return [_gpu_state(by_index[i]) for i in sorted(by_index)]


class FakeBackend:
    """GpuBackend over a scenario file; XID events are delivered once each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._scenario: Scenario | None = None
        self._stamp: tuple[int, int] | None = None
        self._problem: str | None = None
        self._delivered: set[str] = set()

    def _reload(self) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            self._stamp = stamp
            scenario = parse_scenario(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            problem = f"scenario {self.path}: {exc}"
            if problem != self._problem:
                log.error("%s; keeping the previous scenario", problem)
            self._problem = problem
            if isinstance(exc, OSError):
                self._stamp = None  # retry next time: the file may come back
            return
        if self._problem:
            log.info("scenario %s valid again", self.path)
        self._problem = None
        self._scenario = scenario

    def sample(self) -> GpuSample:
        """Re-read the file if it changed and return its GPUs and new events."""
        self._reload()
        if self._scenario is None:
            return GpuSample(error=self._problem or f"scenario {self.path}: not loaded")
        if self._scenario.nvml_error:
            return GpuSample(error=f"NVML: {self._scenario.nvml_error}")
        events: list[XidEvent] = []
        for pos, ev in enumerate(self._scenario.xid_events):
            key = ev.id or f"{pos}:{ev.gpu}:{ev.xid}"
            if key not in self._delivered:
                self._delivered.add(key)
                events.append(XidEvent(ev.gpu, ev.xid, ev.message))
        warnings = [f"{self._problem}; previous scenario kept"] if self._problem else []
        return GpuSample(scenario_gpus(self._scenario), events, None, warnings)

    def close(self) -> None:
        """Nothing to release."""
