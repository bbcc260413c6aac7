"""The real GPU backend. The only module that imports pynvml.

It translates NVML values and errors into ``gpu_backend`` types: "not supported"
(and "invalid argument" for links a GPU does not have) means the field is skipped,
"GPU is lost" marks the GPU lost, any other NVML error is recorded on the GPU so the
probe reports it as UNKNOWN. XIDs arrive through an NVML event set, polled with a zero
timeout so a sample never blocks.
"""

from __future__ import annotations

import logging
from typing import Any

from hyperpod_agent.probes.gpu_backend import GpuSample, GpuState, NvLink, XidEvent

log = logging.getLogger(__name__)

MAX_EVENTS_PER_SAMPLE = 256


class _Lost(Exception):
    pass


class NvmlBackend:
    """GpuBackend over NVML. ``nvml`` is the pynvml module (injectable for tests of this
    translation layer; the machines that build this project have no GPU)."""

    def __init__(self, nvml: Any | None = None, events: bool = True) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._n = nvml
        self._want_events = events
        self._ready = False
        self._event_set: Any = None
        self._errors: list[str] = []

    # -- translation helpers -------------------------------------------------------
    def _code(self, exc: BaseException) -> int | None:
        return getattr(exc, "value", None)

    def _skip_codes(self) -> tuple[int, ...]:
        return (self._n.NVML_ERROR_NOT_SUPPORTED, self._n.NVML_ERROR_INVALID_ARGUMENT)

    def _get(self, what: str, fn: Any, *args: Any) -> Any:
        """Call an NVML getter: None for "not supported", _Lost for a lost GPU, None
        plus a recorded error for anything else."""
        try:
            return fn(*args)
        except self._n.NVMLError as exc:
            code = self._code(exc)
            if code in self._skip_codes():
                return None
            if code == self._n.NVML_ERROR_GPU_IS_LOST:
                raise _Lost(what) from None
            self._errors.append(f"{what}: {exc}")
            return None

    def _init(self) -> None:
        if self._ready:
            return
        self._n.nvmlInit()
        self._ready = True
        if self._want_events:
            try:
                self._event_set = self._n.nvmlEventSetCreate()
            except self._n.NVMLError as exc:
                log.warning("NVML event set unavailable, XIDs only from the kernel log: %s", exc)

    def _register(self, handle: Any, index: int) -> None:
        if self._event_set is None:
            return
        try:
            self._n.nvmlDeviceRegisterEvents(
                handle, self._n.nvmlEventTypeXidCriticalError, self._event_set
            )
        except self._n.NVMLError as exc:
            if self._code(exc) not in self._skip_codes():
                log.warning("gpu%d: cannot register for XID events: %s", index, exc)

    # -- reading -------------------------------------------------------------------
    def _read_gpu(self, index: int, first: bool) -> GpuState:
        n = self._n
        self._errors = []
        try:
            handle = n.nvmlDeviceGetHandleByIndex(index)
        except n.NVMLError as exc:
            if self._code(exc) == n.NVML_ERROR_GPU_IS_LOST:
                return GpuState(index=index, lost=True)
            return GpuState(index=index, errors=(f"handle: {exc}",))
        if first:
            self._register(handle, index)
        try:
            return self._read_fields(index, handle)
        except _Lost:
            return GpuState(index=index, lost=True)

    def _read_fields(self, index: int, h: Any) -> GpuState:
        n = self._n
        uuid = self._get("uuid", n.nvmlDeviceGetUUID, h)
        name = self._get("name", n.nvmlDeviceGetName, h)
        pci = self._get("pci", n.nvmlDeviceGetPciInfo, h)
        bus_id = getattr(pci, "busId", None) if pci is not None else None
        if isinstance(bus_id, bytes):
            bus_id = bus_id.decode()
        unc, vol, agg = (
            n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            n.NVML_VOLATILE_ECC,
            n.NVML_AGGREGATE_ECC,
        )
        remap = self._get("row remap", n.nvmlDeviceGetRemappedRows, h)
        pages = self._get(
            "retired pages",
            n.nvmlDeviceGetRetiredPages,
            h,
            n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        pending = self._get("retired pages pending", n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        return GpuState(
            index=index,
            uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
            name=name.decode() if isinstance(name, bytes) else name,
            pci_bus_id=bus_id,
            temperature_c=self._get(
                "temperature", n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU
            ),
            ecc_volatile_uncorrected=self._get("ecc", n.nvmlDeviceGetTotalEccErrors, h, unc, vol),
            ecc_aggregate_uncorrected=self._get("ecc", n.nvmlDeviceGetTotalEccErrors, h, unc, agg),
            row_remap_pending=bool(remap[2]) if remap is not None else None,
            row_remap_failure=bool(remap[3]) if remap is not None else None,
            retired_pages=len(pages) if pages is not None else None,
            retired_pages_pending=bool(pending) if pending is not None else None,
            nvlinks=self._read_nvlinks(h),
            throttle_reasons=self._read_throttle(h),
            pcie_width=self._get("pcie", n.nvmlDeviceGetCurrPcieLinkWidth, h),
            pcie_max_width=self._get("pcie", n.nvmlDeviceGetMaxPcieLinkWidth, h),
            pcie_gen=self._get("pcie", n.nvmlDeviceGetCurrPcieLinkGeneration, h),
            pcie_max_gen=self._get("pcie", n.nvmlDeviceGetMaxPcieLinkGeneration, h),
            errors=tuple(self._errors),
        )

    def _read_nvlinks(self, h: Any) -> tuple[NvLink, ...]:
        n = self._n
        counters = (
            n.NVML_NVLINK_ERROR_DL_REPLAY,
            n.NVML_NVLINK_ERROR_DL_RECOVERY,
            n.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            n.NVML_NVLINK_ERROR_DL_CRC_DATA,
        )
        links: list[NvLink] = []
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            state = self._get(f"nvlink{link}", n.nvmlDeviceGetNvLinkState, h, link)
            if state is None:  # no such link (or no NVLink at all): the list ends here
                break
            values = [
                self._get(f"nvlink{link}", n.nvmlDeviceGetNvLinkErrorCounter, h, link, c)
                for c in counters
            ]
            known = [v for v in values if v is not None]
            errors = sum(known) if known else None
            links.append(NvLink(link, state == n.NVML_FEATURE_ENABLED, errors))
        return tuple(links)

    def _read_throttle(self, h: Any) -> frozenset[str] | None:
        n = self._n
        getter = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        mask = self._get("throttle", getter, h)
        if mask is None:
            return None
        bits = {"hw_slowdown": 0x8, "hw_thermal": 0x40, "hw_power_brake": 0x80}
        return frozenset(name for name, bit in bits.items() if mask & bit)

    def _drain_events(self) -> list[XidEvent]:
        n = self._n
        events: list[XidEvent] = []
        if self._event_set is None:
            return events
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                data = n.nvmlEventSetWait_v2(self._event_set, 0)
            except n.NVMLError as exc:
                if self._code(exc) != n.NVML_ERROR_TIMEOUT:
                    log.warning("NVML event wait: %s", exc)
                break
            if data.eventType != n.nvmlEventTypeXidCriticalError:
                continue
            try:
                gpu: int | None = int(n.nvmlDeviceGetIndex(data.device))
            except n.NVMLError:
                gpu = None
            events.append(XidEvent(gpu, int(data.eventData), "reported by NVML"))
        return events

    def sample(self) -> GpuSample:
        """Read every GPU NVML lists, then drain pending XID events."""
        n = self._n
        first = not self._ready
        try:
            self._init()
            count = int(n.nvmlDeviceGetCount())
        except n.NVMLError as exc:
            self.close()
            return GpuSample(error=f"NVML: {exc}")
        gpus = [self._read_gpu(i, first) for i in range(count)]
        return GpuSample(gpus=gpus, events=self._drain_events())

    def close(self) -> None:
        """Free the event set and shut NVML down; the next sample initialises again."""
        n = self._n
        if self._event_set is not None:
            try:
                n.nvmlEventSetFree(self._event_set)
            except n.NVMLError:
                pass
            self._event_set = None
        if self._ready:
            try:
                n.nvmlShutdown()
            except n.NVMLError:
                pass
            self._ready = False
