"""The NVML translation layer (``_nvml.NvmlBackend``).

No machine that builds this project has a GPU, so these tests pass a small stub in
place of the pynvml module: it has the same function names and error type and
returns canned values. This is allowed for the translation layer only; the gpu probe
itself is tested against the fake scenario backend.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from hyperpod_agent.probes._nvml import NvmlBackend

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
LOST = pynvml.NVML_ERROR_GPU_IS_LOST


class StubError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def stub(**overrides: Any) -> SimpleNamespace:
    """A pynvml stand-in: two healthy GPUs with two NVLinks each."""
    consts = {
        k: getattr(pynvml, k)
        for k in dir(pynvml)
        if k.startswith(("NVML_", "nvml")) and isinstance(getattr(pynvml, k), int)
    }
    events: list[Any] = []

    def fail(code: int) -> Any:
        def f(*_a: Any) -> Any:
            raise StubError(code)

        return f

    def wait(_set: Any, _timeout: int) -> Any:
        if events:
            return events.pop(0)
        raise StubError(pynvml.NVML_ERROR_TIMEOUT)

    def link_state(_h: Any, link: int) -> int:
        if link >= 2:
            raise StubError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(pynvml.NVML_FEATURE_ENABLED)

    ns = SimpleNamespace(
        **consts,
        NVMLError=StubError,
        calls=[],
        events=events,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetIndex=lambda h: int(h[1:]),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=b"00000000:3B:00.0"),
        nvmlDeviceGetTemperature=lambda h, s: 41,
        nvmlDeviceGetTotalEccErrors=lambda h, t, c: 0,
        nvmlDeviceGetRemappedRows=lambda h: (0, 0, 0, 0),
        nvmlDeviceGetRetiredPages=fail(NOT_SUPPORTED),
        nvmlDeviceGetRetiredPagesPendingStatus=fail(NOT_SUPPORTED),
        nvmlDeviceGetNvLinkState=link_state,
        nvmlDeviceGetNvLinkErrorCounter=lambda h, link, c: 1,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0,
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 4,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 4,
        nvmlEventSetCreate=lambda: "set",
        nvmlEventSetFree=lambda s: None,
        nvmlDeviceRegisterEvents=lambda h, t, s: None,
        nvmlEventSetWait_v2=wait,
    )
    for name, value in overrides.items():
        setattr(ns, name, value)
    return ns


def test_healthy_values_are_translated() -> None:
    sample = NvmlBackend(stub()).sample()
    assert sample.error is None
    g = sample.gpus[0]
    assert (g.index, g.uuid, g.pci_bus_id, g.temperature_c) == (0, "GPU-h0", "00000000:3B:00.0", 41)
    assert (g.ecc_volatile_uncorrected, g.row_remap_pending, g.row_remap_failure) == (
        0,
        False,
        False,
    )
    assert [(n.link, n.up, n.errors) for n in g.nvlinks] == [(0, True, 4), (1, True, 4)]
    assert g.throttle_reasons == frozenset()
    assert (g.pcie_width, g.pcie_max_width, g.pcie_gen, g.pcie_max_gen) == (16, 16, 4, 4)
    assert g.errors == ()
    assert g.name == "NVIDIA H100 80GB HBM3"  # bytes from older pynvml, decoded


def test_not_supported_fields_are_none() -> None:
    ns = NOT_SUPPORTED
    nv = stub(
        nvmlDeviceGetTemperature=lambda *a: (_ for _ in ()).throw(StubError(ns)),
        nvmlDeviceGetRemappedRows=lambda *a: (_ for _ in ()).throw(StubError(ns)),
        nvmlDeviceGetNvLinkState=lambda *a: (_ for _ in ()).throw(StubError(ns)),
    )
    g = NvmlBackend(nv).sample().gpus[1]
    assert g.temperature_c is None and g.row_remap_pending is None and g.nvlinks == ()
    assert g.retired_pages is None and g.retired_pages_pending is None
    assert g.errors == ()


def test_gpu_is_lost_on_any_field_marks_gpu_lost() -> None:
    def ecc(h: str, *_a: Any) -> int:
        if h == "h1":
            raise StubError(LOST)
        return 0

    sample = NvmlBackend(stub(nvmlDeviceGetTotalEccErrors=ecc)).sample()
    assert [g.lost for g in sample.gpus] == [False, True]


def test_lost_on_handle() -> None:
    def handle(i: int) -> str:
        if i == 0:
            raise StubError(LOST)
        return f"h{i}"

    assert NvmlBackend(stub(nvmlDeviceGetHandleByIndex=handle)).sample().gpus[0].lost


def test_other_errors_are_recorded_not_raised() -> None:
    nv = stub(
        nvmlDeviceGetTemperature=lambda *a: (_ for _ in ()).throw(
            StubError(pynvml.NVML_ERROR_UNKNOWN)
        )
    )
    g = NvmlBackend(nv).sample().gpus[0]
    assert g.temperature_c is None
    assert len(g.errors) == 1 and g.errors[0].startswith("temperature:")


def test_row_remap_and_throttle_bits() -> None:
    nv = stub(
        nvmlDeviceGetRemappedRows=lambda h: (3, 1, 1, 1),
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x8 | 0x40 | 0x1,
    )
    g = NvmlBackend(nv).sample().gpus[0]
    assert (g.row_remap_pending, g.row_remap_failure) == (True, True)
    assert g.throttle_reasons == frozenset({"hw_slowdown", "hw_thermal"})


def test_nvlink_down_state() -> None:
    def state(h: str, link: int) -> int:
        if link >= 2:
            raise StubError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link == 1 else 1

    g = NvmlBackend(stub(nvmlDeviceGetNvLinkState=state)).sample().gpus[0]
    assert [n.up for n in g.nvlinks] == [True, False]


def test_init_failure_is_sample_error_and_retried() -> None:
    attempts: list[int] = []

    def init() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise StubError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    backend = NvmlBackend(stub(nvmlInit=init))
    first = backend.sample()
    assert first.error is not None and first.error.startswith("NVML:")
    assert backend.sample().error is None
    assert len(attempts) == 2


def test_xid_events_are_drained_without_blocking() -> None:
    nv = stub()
    xid = nv.nvmlEventTypeXidCriticalError
    nv.events.extend(
        [
            SimpleNamespace(device="h1", eventType=xid, eventData=79),
            SimpleNamespace(device="h0", eventType=0x1, eventData=0),
        ]
    )
    backend = NvmlBackend(nv)
    sample = backend.sample()
    assert [(e.gpu, e.xid) for e in sample.events] == [(1, 79)]
    assert backend.sample().events == []


def test_event_set_unsupported_still_samples() -> None:
    nv = stub(nvmlEventSetCreate=lambda: (_ for _ in ()).throw(StubError(NOT_SUPPORTED)))
    sample = NvmlBackend(nv).sample()
    assert sample.error is None and sample.events == []


@pytest.mark.parametrize("events", [True, False])
def test_close_shuts_down(events: bool) -> None:
    calls: list[str] = []
    nv = stub(
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlEventSetFree=lambda s: calls.append("free"),
    )
    backend = NvmlBackend(nv, events=events)
    backend.sample()
    backend.close()
    assert calls == (["free", "shutdown"] if events else ["shutdown"])
