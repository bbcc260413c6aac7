"""The cpu probe: CPUs and memory present, memory pressure, load, hardware errors,
and processes stuck in uninterruptible sleep.

Reads ``/sys/devices/system/cpu/online``, ``/proc/meminfo``, ``/proc/loadavg``,
``/proc/interrupts`` (the MCE row), ``/sys/devices/system/edac/mc/mc*/{ce,ue}_count``
and ``/proc/<pid>/stat``, all under the context's roots. Error counters are judged on
their growth between runs, so errors from before the agent started do not count
(except uncorrectable memory errors, which always do).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from hyperpod_agent.health import Action, Finding, Status
from hyperpod_agent.probes._sysfs import CounterTracker, list_dir, read_int, read_text, under
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig, ProbeContext


class CpuConfig(ProbeConfig):
    """``[probes.cpu]``. Counts are only compared when an expected value is set."""

    expected_cpus: int | None = Field(default=None, ge=1)
    expected_mem_gib: float | None = Field(default=None, gt=0)
    mem_tolerance_pct: float = Field(default=5.0, ge=0, lt=100)
    available_warn_pct: float = Field(default=5.0, ge=0, le=100)
    swap_warn_pct: float = Field(default=50.0, ge=0, le=100)
    load_per_cpu_warn: float = Field(default=4.0, gt=0)
    ce_delta_warn: int = Field(default=1, ge=1, description="corrected errors per run to warn")
    d_state_warn: int = Field(default=20, ge=1, description="processes stuck in D to warn")

    @model_validator(mode="after")
    def _sane(self) -> CpuConfig:
        if self.expected_mem_gib is not None and self.expected_mem_gib > 1 << 20:
            raise ValueError("expected_mem_gib: expected GiB, got a value above 1 PiB")
        return self


def parse_cpu_list(text: str) -> int:
    """Number of CPUs in a kernel list such as ``"0-3,5,7-8"``."""
    count = 0
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        count += (int(high) - int(low) + 1) if high else 1
    return count


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as key -> kB (``HugePages_*`` counts are taken as they are)."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[key.strip()] = int(fields[0])
    return values


def parse_loadavg(text: str) -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages."""
    one, five, fifteen = text.split()[:3]
    return float(one), float(five), float(fifteen)


def parse_mce_count(text: str) -> int | None:
    """Total machine-check exceptions from ``/proc/interrupts`` (the ``MCE:`` row)."""
    for line in text.splitlines():
        label, _, rest = line.strip().partition(":")
        if label == "MCE":
            return sum(int(f) for f in rest.split() if f.isdigit())
    return None


def parse_stat_state(text: str) -> tuple[str, int] | None:
    """Process state letter and start time from ``/proc/<pid>/stat``; the command name
    may contain spaces and parentheses, so split after the last ``)``."""
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 20:
        return None
    return fields[0], int(fields[19])


def read_d_state(procfs_root: Path) -> set[tuple[int, int]]:
    """(pid, start time) of every process in uninterruptible sleep right now."""
    stuck = set()
    for name in list_dir(procfs_root):
        if not name.isdigit():
            continue
        try:
            text = (procfs_root / name / "stat").read_text(encoding="utf-8", errors="replace")
        except OSError:  # the process exited between listing and reading
            continue
        parsed = parse_stat_state(text)
        if parsed is not None and parsed[0] == "D":
            stuck.add((int(name), parsed[1]))
    return stuck


def read_edac(sysfs_root: Path) -> dict[str, tuple[int, int]]:
    """Memory controller -> (corrected, uncorrected) error counts."""
    base = under(sysfs_root, "/devices/system/edac/mc")
    counts = {}
    for mc in list_dir(base):
        if not mc.startswith("mc"):
            continue
        ce, ue = read_int(base / mc / "ce_count"), read_int(base / mc / "ue_count")
        if ce is not None or ue is not None:
            counts[mc] = (ce or 0, ue or 0)
    return counts


class CpuProbe(Probe[CpuConfig]):
    name = "cpu"
    config_model = CpuConfig

    def __init__(self, config: CpuConfig, context: ProbeContext) -> None:
        super().__init__(config, context)
        self._counters = CounterTracker()
        self._d_state: set[tuple[int, int]] | None = None

    def check(self) -> Outcome:
        """Check CPUs, memory, load, hardware error counters and D-state processes."""
        ctx, cfg = self.context, self.config
        findings: list[Finding] = []
        cpus = self._online_cpus()
        if cfg.expected_cpus is not None and cpus < cfg.expected_cpus:
            findings.append(
                _finding(
                    "cpu",
                    "cpu_missing",
                    Status.FAIL,
                    Action.REBOOT,
                    f"{cpus} CPUs online, expected {cfg.expected_cpus}",
                )
            )
        meminfo_text = read_text(under(ctx.procfs_root, "/meminfo"))
        if meminfo_text is None:
            raise FileNotFoundError("no meminfo under the procfs root")
        findings.extend(self._memory(parse_meminfo(meminfo_text)))
        loadavg = read_text(under(ctx.procfs_root, "/loadavg"))
        if loadavg is not None:
            per_cpu = parse_loadavg(loadavg)[0] / max(cpus, 1)
            if per_cpu >= cfg.load_per_cpu_warn:
                findings.append(
                    _finding(
                        "cpu",
                        "load_high",
                        Status.WARN,
                        Action.MONITOR,
                        f"load {per_cpu:.1f} per CPU",
                    )
                )
        findings.extend(self._hardware_errors())
        findings.extend(self._stuck_processes())
        return Outcome.from_findings(findings, ok_message=f"{cpus} CPUs online")

    def _online_cpus(self) -> int:
        text = read_text(under(self.context.sysfs_root, "/devices/system/cpu/online"))
        if text is None:
            raise FileNotFoundError("no devices/system/cpu/online under the sysfs root")
        return parse_cpu_list(text)

    def _memory(self, mem: dict[str, int]) -> list[Finding]:
        cfg, findings = self.config, []
        total_kb = mem.get("MemTotal", 0)
        if cfg.expected_mem_gib is not None:
            floor_kb = cfg.expected_mem_gib * (1 << 20) * (1 - cfg.mem_tolerance_pct / 100)
            if total_kb < floor_kb:
                findings.append(
                    _finding(
                        "memory",
                        "mem_missing",
                        Status.FAIL,
                        Action.REPLACE,
                        f"{total_kb / (1 << 20):.1f} GiB installed, "
                        f"expected {cfg.expected_mem_gib:g} GiB",
                    )
                )
        if total_kb > 0 and "MemAvailable" in mem:
            pct = 100.0 * mem["MemAvailable"] / total_kb
            if pct < cfg.available_warn_pct:
                findings.append(
                    _finding(
                        "memory",
                        "mem_low",
                        Status.WARN,
                        Action.MONITOR,
                        f"{pct:.1f}% memory available",
                    )
                )
        swap_total = mem.get("SwapTotal", 0)
        if swap_total > 0:
            used = 100.0 * (swap_total - mem.get("SwapFree", swap_total)) / swap_total
            if used >= cfg.swap_warn_pct:
                findings.append(
                    _finding(
                        "memory", "swap_high", Status.WARN, Action.MONITOR, f"{used:.0f}% swap used"
                    )
                )
        return findings

    def _hardware_errors(self) -> list[Finding]:
        findings = []
        for mc, (ce, ue) in sorted(read_edac(self.context.sysfs_root).items()):
            grew_ce = self._counters.delta(f"{mc}:ce", ce)
            if ue > 0:
                findings.append(
                    _finding(
                        mc,
                        "mem_ue",
                        Status.FAIL,
                        Action.REPLACE,
                        f"{ue} uncorrectable memory errors",
                    )
                )
            if grew_ce >= self.config.ce_delta_warn:
                findings.append(
                    _finding(
                        mc,
                        "mem_ce",
                        Status.WARN,
                        Action.MONITOR,
                        f"corrected memory errors +{grew_ce} ({ce} total)",
                    )
                )
        interrupts = read_text(under(self.context.procfs_root, "/interrupts"))
        mce = parse_mce_count(interrupts) if interrupts is not None else None
        if mce is not None:
            grew = self._counters.delta("mce", mce)
            if grew > 0:
                findings.append(
                    _finding(
                        "cpu",
                        "mce",
                        Status.WARN,
                        Action.MONITOR,
                        f"machine-check exceptions +{grew}",
                    )
                )
        return findings

    def _stuck_processes(self) -> list[Finding]:
        """Processes in D state now *and* at the previous run: a single sample
        catches normal short I/O waits."""
        now = read_d_state(self.context.procfs_root)
        previous, self._d_state = self._d_state, now
        if previous is None:
            return []
        stuck = now & previous
        if len(stuck) < self.config.d_state_warn:
            return []
        pids = ",".join(str(pid) for pid, _ in sorted(stuck)[:5])
        return [
            _finding(
                "cpu",
                "d_state",
                Status.WARN,
                Action.MONITOR,
                f"{len(stuck)} processes stuck in D state (pids {pids}...)",
            )
        ]


def _finding(comp: str, code: str, status: Status, action: Action, message: str) -> Finding:
    return Finding(component=comp, code=code, status=status, action=action, message=message)
