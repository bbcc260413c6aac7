"""The gpu probe: GPU count, lost GPUs, XIDs, ECC, row remapping, NVLink, thermals, PCIe.

Facts come from one backend interface (``gpu_backend.GpuBackend``): NVML on real
nodes, a JSON scenario in drills and tests. XIDs come from the backend's events and,
as a second source, from ``NVRM: Xid`` lines in the kernel log. An XID that asks for
RESET or more stays reported until the agent restarts (which a reset or reboot
causes); a MONITOR XID is reported as WARN for ``xid_window_s`` after it was last seen.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hyperpod_agent.health import Action, Finding, Status
from hyperpod_agent.probes._baseline import baseline_of
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig, ProbeContext
from hyperpod_agent.probes.gpu_backend import GpuBackend, GpuSample, GpuState
from hyperpod_agent.probes.xid import KmsgReader, XidRule, normalise_pci, xid_rule

log = logging.getLogger(__name__)

# The same XID arriving from NVML and from the kernel log within this window is one event.
DEDUPE_S = 10.0


class XidOverride(BaseModel):
    """``gpu.xid_actions."79" = { action = "REPLACE", urgent = true }``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Action
    urgent: bool = False


class GpuConfig(ProbeConfig):
    """``[probes.gpu]``."""

    backend: Literal["nvml", "fake"] = "nvml"
    fake_scenario: Path | None = None
    expected_count: int | None = Field(
        default=None, ge=0, le=64, description="None: the count seen at the first good sample"
    )
    max_temperature_c: int = Field(default=90, gt=0, le=150)
    check_pcie_gen: bool = Field(
        default=False, description="idle GPUs lower their link generation to save power"
    )
    retired_pages_limit: int = Field(default=60, ge=1)
    xid_actions: dict[str, Action | XidOverride] = Field(default_factory=dict)
    xid_window_s: float = Field(default=300.0, gt=0)
    kmsg_path: Path | None = Path("/dev/kmsg")
    kmsg_max_records: int = Field(default=1000, ge=1, le=100_000)

    @field_validator("kmsg_path", mode="before")
    @classmethod
    def _empty_disables(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("xid_actions")
    @classmethod
    def _xid_keys(cls, value: dict[str, Action | XidOverride]) -> dict[str, Action | XidOverride]:
        for key in value:
            if not key.isdigit():
                raise ValueError(f"XID {key!r} is not a number")
        return value

    @model_validator(mode="after")
    def _fake_needs_scenario(self) -> GpuConfig:
        if self.backend == "fake" and self.fake_scenario is None:
            raise ValueError('backend = "fake" needs fake_scenario = PATH')
        return self

    def xid_overrides(self) -> dict[int, XidRule]:
        """``xid_actions`` as rules keyed by XID number."""
        out: dict[int, XidRule] = {}
        for key, value in self.xid_actions.items():
            if isinstance(value, XidOverride):
                out[int(key)] = XidRule(value.action, value.urgent)
            else:
                out[int(key)] = XidRule(value, False)
        return out


def make_backend(config: GpuConfig) -> GpuBackend:
    """The backend ``config`` names (imports pynvml only for the real one)."""
    if config.backend == "fake":
        from hyperpod_agent.probes._fake_nvml import FakeBackend

        assert config.fake_scenario is not None
        return FakeBackend(config.fake_scenario)
    from hyperpod_agent.probes._nvml import NvmlBackend

    return NvmlBackend()


def _f(
    component: str,
    code: str,
    status: Status,
    message: str,
    action: Action = Action.NONE,
    urgent: bool = False,
) -> Finding:
    return Finding(
        component=component,
        code=code,
        status=status,
        action=action,
        urgent=urgent,
        message=message[:512],
    )


def check_gpu(gpu: GpuState, config: GpuConfig) -> list[Finding]:
    """Findings that follow from one GPU's state alone (pure)."""
    c = gpu.component
    if gpu.lost:
        return [_f(c, "gpu_lost", Status.FAIL, "GPU is lost", Action.REBOOT, True)]
    out: list[Finding] = []
    if gpu.errors:
        out.append(_f(c, "nvml_error", Status.UNKNOWN, "NVML: " + "; ".join(gpu.errors)))
    if gpu.ecc_volatile_uncorrected:
        out.append(
            _f(
                c,
                "ecc_uncorrectable",
                Status.FAIL,
                f"{gpu.ecc_volatile_uncorrected} uncorrectable ECC errors since reset",
                Action.RESET,
                True,
            )
        )
    if gpu.row_remap_failure:
        out.append(_f(c, "row_remap_failure", Status.FAIL, "row remapping failed", Action.REPLACE))
    elif gpu.row_remap_pending:
        out.append(
            _f(c, "row_remap_pending", Status.FAIL, "row remap pending a GPU reset", Action.RESET)
        )
    if gpu.retired_pages is not None and gpu.retired_pages >= config.retired_pages_limit:
        out.append(
            _f(
                c,
                "retired_pages",
                Status.FAIL,
                f"{gpu.retired_pages} retired pages (limit {config.retired_pages_limit})",
                Action.REPLACE,
            )
        )
    elif gpu.retired_pages_pending:
        out.append(
            _f(
                c,
                "retired_pages_pending",
                Status.FAIL,
                "page retirement pending a reset",
                Action.RESET,
            )
        )
    down = [str(n.link) for n in gpu.nvlinks if n.up is False]
    if down:
        out.append(_f(c, "nvlink_down", Status.FAIL, f"NVLink {','.join(down)} down", Action.RESET))
    hot: list[str] = []
    if gpu.temperature_c is not None and gpu.temperature_c >= config.max_temperature_c:
        hot.append(f"{gpu.temperature_c} C (max {config.max_temperature_c})")
    if gpu.throttle_reasons:
        hot.append("throttled: " + ",".join(sorted(gpu.throttle_reasons)))
    if hot:
        out.append(_f(c, "thermal", Status.WARN, "; ".join(hot), Action.MONITOR))
    slow: list[str] = []
    if gpu.pcie_width is not None and gpu.pcie_max_width and gpu.pcie_width < gpu.pcie_max_width:
        slow.append(f"PCIe x{gpu.pcie_width} of x{gpu.pcie_max_width}")
    if (
        config.check_pcie_gen
        and gpu.pcie_gen is not None
        and gpu.pcie_max_gen
        and gpu.pcie_gen < gpu.pcie_max_gen
    ):
        slow.append(f"PCIe gen{gpu.pcie_gen} of gen{gpu.pcie_max_gen}")
    if slow:
        out.append(_f(c, "pcie_degraded", Status.WARN, "; ".join(slow), Action.MONITOR))
    return out


class GpuProbe(Probe[GpuConfig]):
    """See the module docstring."""

    name = "gpu"
    config_model = GpuConfig

    def __init__(
        self, config: GpuConfig, context: ProbeContext, backend: GpuBackend | None = None
    ) -> None:
        super().__init__(config, context)
        self._backend = backend
        self._overrides = config.xid_overrides()
        self._expected = config.expected_count
        self._latched: dict[tuple[str, str], Finding] = {}
        self._monitor: dict[tuple[str, str], tuple[float, Finding]] = {}
        self._xid_seen: dict[tuple[str, int], tuple[float, str, int]] = {}
        self._nvlink_errors: dict[tuple[int, int], int] = {}
        self._ecc_aggregate: dict[int, int] = {}
        self._kmsg = (
            KmsgReader(config.kmsg_path, config.kmsg_max_records)
            if (config.kmsg_path and str(config.kmsg_path))
            else None
        )
        self._kmsg_problem: str | None = None
        self.xid_counts: dict[int, int] = {}  # cumulative, exported as hyperpod_gpu_xid_total

    def _record_xid(self, component: str, xid: int, message: str, now: float, source: str) -> None:
        last, last_source, count = self._xid_seen.get((component, xid), (-1e18, "", 0))
        if now - last < DEDUPE_S and source != last_source:
            return  # the other source already told us about this one
        count += 1
        self._xid_seen[(component, xid)] = (now, source, count)
        self.xid_counts[xid] = self.xid_counts.get(xid, 0) + 1
        rule = xid_rule(xid, message, self._overrides)
        if rule.action == Action.NONE:
            return
        status = Status.FAIL if rule.action.takes_out else Status.WARN
        text = f"XID {xid}" + (f": {message}" if message else "") + f" (seen {count}x)"
        finding = _f(component, f"xid{xid}", status, text, rule.action, rule.urgent)
        log.warning(
            "%s: %s -> %s%s", component, text, rule.action.value, " urgent" if rule.urgent else ""
        )
        if status == Status.FAIL:
            self._latched[(component, f"xid{xid}")] = finding
        else:
            self._monitor[(component, f"xid{xid}")] = (now, finding)

    def _kernel_xids(self, sample: GpuSample, now: float) -> list[Finding]:
        if self._kmsg is None:
            return []
        try:
            records = self._kmsg.read_xids()
        except OSError as exc:
            problem = f"cannot read {self._kmsg.path}: {exc.strerror or exc}"
            if problem != self._kmsg_problem:
                log.warning("gpu probe: %s", problem)
            self._kmsg_problem = problem
            return [_f("kmsg", "source_error", Status.UNKNOWN, problem)]
        self._kmsg_problem = None
        by_pci = {normalise_pci(g.pci_bus_id): g.component for g in sample.gpus if g.pci_bus_id}
        for rec in records:
            component = by_pci.get(rec.pci, f"pci{rec.pci}")
            self._record_xid(component, rec.xid, rec.message, now, "kmsg")
        return []

    def _trend(self, gpus: list[GpuState]) -> list[Finding]:
        """Findings from counters that grew since the previous sample."""
        out: list[Finding] = []
        for g in gpus:
            agg = g.ecc_aggregate_uncorrected
            before = self._ecc_aggregate.get(g.index)
            if agg is not None:
                if before is not None and agg > before:
                    key = (g.component, "ecc_uncorrectable")
                    self._latched[key] = _f(
                        *key,
                        Status.FAIL,
                        f"aggregate uncorrectable ECC {before} -> {agg}",
                        Action.RESET,
                        True,
                    )
                self._ecc_aggregate[g.index] = agg
            grown: list[str] = []
            for link in g.nvlinks:
                if link.errors is None:
                    continue
                prev = self._nvlink_errors.get((g.index, link.link))
                if prev is not None and link.errors > prev:
                    grown.append(f"{link.link} (+{link.errors - prev})")
                self._nvlink_errors[(g.index, link.link)] = link.errors
            if grown:
                out.append(
                    _f(
                        g.component,
                        "nvlink_errors",
                        Status.WARN,
                        "NVLink errors growing on link " + ", ".join(grown),
                        Action.MONITOR,
                    )
                )
        return out

    def check(self) -> Outcome:
        """Sample the backend, fold in XIDs and report every finding."""
        if self._backend is None:
            self._backend = make_backend(self.config)
        now = time.monotonic()
        sample = self._backend.sample()
        findings: list[Finding] = []
        if sample.error:
            findings.append(_f("nvml", "nvml_error", Status.UNKNOWN, sample.error))
        findings += [_f("gpu-backend", "backend_error", Status.UNKNOWN, w) for w in sample.warnings]
        for ev in sample.events:
            component = f"gpu{ev.gpu}" if ev.gpu is not None else "gpu"
            self._record_xid(component, ev.xid, ev.message, now, "event")
        findings += self._kernel_xids(sample, now)
        if not sample.error:
            if self._expected is None and sample.gpus:
                self._expected = len(sample.gpus)
            expected, source = self._expected_count()
            if expected is not None and len(sample.gpus) < expected:
                findings.append(
                    _f(
                        "gpus",
                        "gpu_count",
                        Status.FAIL,
                        f"{len(sample.gpus)} GPUs visible, {expected} expected{source}",
                        Action.REBOOT,
                        True,
                    )
                )
            for gpu in sample.gpus:
                findings += check_gpu(gpu, self.config)
            findings += self._trend(sample.gpus)
        current = {(f.component, f.code) for f in findings}
        findings += [f for k, f in self._latched.items() if k not in current]
        for key, (seen, finding) in list(self._monitor.items()):
            if now - seen > self.config.xid_window_s:
                del self._monitor[key]
            elif key not in current:
                findings.append(finding)
        return Outcome.from_findings(findings, f"{len(sample.gpus)} GPUs ok")

    def _expected_count(self) -> tuple[int | None, str]:
        """How many GPUs this node must show: ``expected_count`` when configured, else
        the node's baseline, else the count at the first good sample."""
        baseline = baseline_of(self.context.baseline)
        if self.config.expected_count is None and baseline is not None and baseline.gpu:
            return baseline.gpu.count, " (baseline)"
        return self._expected, ""

    def close(self) -> None:
        """Release the backend and the kernel log."""
        if self._backend is not None:
            self._backend.close()
        if self._kmsg is not None:
            self._kmsg.close()
