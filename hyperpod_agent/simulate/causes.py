"""Fault classes: what a fault of the trace (or of the parametric model) is to us.

Every simulated fault carries the code, component, action and urgency our agent would
report for it (DESIGN §9, ``probes/xid.py``, ``probes/gpu.py``, ``probes/nic.py``), so the
controller's policy decides about it exactly as it would about a real report. ``dead``
marks the faults that take the whole machine down: no agent report, only a lost
heartbeat and Slurm's ``NOT_RESPONDING``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hyperpod_agent.health import Action

# The categories results are broken down by (lost time by cause).
CATEGORIES = ("gpu", "network", "node", "software", "unknown")
# Lost time that no fault caused: the checkpoints' blocking writes.
CHECKPOINTING = "checkpointing"


@dataclass(frozen=True)
class FaultClass:
    """What the agent reports for one kind of fault."""

    name: str  # short, stable: shown in results
    category: str  # one of CATEGORIES
    component: str
    code: str
    action: Action
    urgent: bool = False
    dead: bool = False  # the machine is down: no report, heartbeat lost


def _c(name: str, category: str, component: str, code: str, action: Action, urgent: bool = False,
       dead: bool = False) -> FaultClass:  # fmt: skip
    return FaultClass(name, category, component, code, action, urgent, dead)


# One entry per kind of fault the simulator knows; the trace's causes map onto these.
CLASSES: dict[str, FaultClass] = {
    c.name: c
    for c in (
        # GPU: uncorrectable ECC asks for a reset, urgently (probes/gpu.py)
        _c("gpu_ecc", "gpu", "gpu0", "ecc_uncorrectable", Action.RESET, urgent=True),
        # XID 79 and its kin: fallen off the bus (DESIGN §9)
        _c("gpu_xid", "gpu", "gpu0", "xid79", Action.REBOOT, urgent=True),
        _c("gpu_lost", "gpu", "gpu0", "gpu_lost", Action.REBOOT, urgent=True),
        _c("gpu_count", "gpu", "gpus", "gpu_count", Action.REBOOT, urgent=True),
        _c("gpu_pcie", "gpu", "gpu0", "pcie_degraded", Action.RESET),
        _c("gpu_thermal", "gpu", "gpu0", "thermal", Action.RESET),
        # pages retired past the limit, a P2P or SDC finding: the GPU goes back to the vendor
        _c("gpu_retire", "gpu", "gpu0", "retired_pages", Action.REPLACE),
        _c("gpu_check", "gpu", "gpu0", "deep_check_failed", Action.REPLACE),
        # network: a data link down is urgent on a running job's node (probes/nic.py)
        _c("link_down", "network", "mlx5_0/1", "link_down", Action.REBOOT, urgent=True),
        _c("nic_lost", "network", "mlx5_0", "nic_missing", Action.REBOOT, urgent=True),
        _c("nic_degraded", "network", "mlx5_0/1", "rate_degraded", Action.REBOOT),
        # the machine: power, cooling, board, CPU
        _c("psu", "node", "psu", "psu_failed", Action.REPLACE),
        _c("fan", "node", "fan", "fan_critical", Action.REPLACE),
        _c("mce", "node", "cpu", "mce", Action.REPLACE),
        _c("node_down", "node", "node", "down", Action.REBOOT, dead=True),
        # software: a read-only file system, a daemon gone, a kernel panic
        _c("fs", "software", "/", "fs_readonly", Action.REBOOT),
        _c("daemon", "software", "slurmd", "slurmd_down", Action.REBOOT),
        _c("firmware", "software", "node", "firmware_mismatch", Action.REPLACE),
        _c("kernel_panic", "software", "node", "down", Action.REBOOT, dead=True),
        # unknown: the agent's verdict names nothing (report_faults: ("node", "faulty"))
        _c("unknown", "unknown", "node", "faulty", Action.REBOOT),
        # a job's ranks stopped: the hang judgement's suspect is rebooted (hangs/plan.py)
        _c("hang_suspect", "unknown", "node", "hang", Action.REBOOT),
    )
}

# StepFun trace: (Class, Desc) -> our class; the Level is not needed to tell them apart.
# What is not listed falls back on the class's row ("*"), then on "unknown".
TRACE_CAUSES: dict[tuple[str, str], str] = {
    ("GPU", "GPU DBE(Double Bit ECC) > Threshold"): "gpu_ecc",
    ("GPU", "GPU xid Error"): "gpu_xid",
    ("GPU", "GPU device unknow error"): "gpu_xid",
    ("GPU", "GPU Lost"): "gpu_lost",
    # NVML timing out is how a GPU that is going away shows to the probe
    ("GPU", "nvidia-smi Timeout"): "gpu_lost",
    ("GPU", "GPU device not found"): "gpu_count",
    ("GPU", "GPU PCI link width low"): "gpu_pcie",
    ("GPU", "GPU Temperature High"): "gpu_thermal",
    ("GPU", "GPU SBE(Single Bit ECC) > Threshold"): "gpu_retire",
    ("GPU", "GPU P2P Bandwidth Low"): "gpu_check",
    ("GPU", "Silent Data Corruption"): "gpu_check",
    ("Parameter Plane Cable", "*"): "link_down",
    ("Change", "*"): "link_down",  # Y-cables taken offline, a remote optical module
    ("NIC", "NIC Lost"): "nic_lost",
    ("NIC", "*"): "nic_degraded",
    ("Power Supply", "*"): "psu",
    ("Fan", "*"): "fan",
    ("CPU", "*"): "mce",
    ("Motherboard", "*"): "node_down",
    ("Riser Card", "*"): "node_down",
    ("System Crash", "*"): "node_down",
    ("RAID Card", "*"): "unknown",
    ("Motherboard Battery", "*"): "unknown",
    ("File System", "*"): "fs",
    ("Software Tool", "*"): "daemon",  # the orchestrator's node daemon (kubelet there)
    ("Operating System", "*"): "kernel_panic",
    ("Firmware", "*"): "firmware",
    # pre-production stress tests: what our deep checks find (docs/deep-checks.md)
    ("Stress Test Failure", "*"): "gpu_check",
    ("Training Task Troubleshooting", "*"): "hang_suspect",
}


def trace_class(cls: str, desc: str) -> FaultClass:
    """Our fault class for a trace fault's ``Class`` and ``Desc``."""
    name = TRACE_CAUSES.get((cls, desc)) or TRACE_CAUSES.get((cls, "*")) or "unknown"
    return CLASSES[name]


# The parametric model's default mix, per category (shares of all faults); within a
# category the classes split evenly. Roughly the trace's hardware/software shares.
DEFAULT_MIX: dict[str, float] = {
    "gpu_xid": 0.25,
    "gpu_ecc": 0.15,
    "gpu_lost": 0.05,
    "gpu_pcie": 0.05,
    "link_down": 0.12,
    "nic_degraded": 0.05,
    "psu": 0.05,
    "fan": 0.05,
    "node_down": 0.03,
    "fs": 0.03,
    "daemon": 0.02,
    "unknown": 0.15,
}
