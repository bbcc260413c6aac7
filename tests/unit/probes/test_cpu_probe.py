"""The cpu probe against fake sysfs/procfs trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hyperpod_agent.health import Action, Status
from hyperpod_agent.probes.base import ProbeContext
from hyperpod_agent.probes.cpu import (
    CpuConfig,
    CpuProbe,
    parse_cpu_list,
    parse_loadavg,
    parse_mce_count,
    parse_meminfo,
    parse_stat_state,
    read_d_state,
)

GIB_KB = 1 << 20
MEMINFO = f"""\
MemTotal:       {64 * GIB_KB} kB
MemFree:         1000000 kB
MemAvailable:   {32 * GIB_KB} kB
SwapTotal:       1000000 kB
SwapFree:        1000000 kB
HugePages_Total:       0
"""
INTERRUPTS = """\
           CPU0       CPU1
  0:         22          0   IO-APIC    2-edge      timer
 MCE:          0          0   Machine check exceptions
 MCP:         10         10   Machine check polls
"""
STAT = "1234 (python (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 98765 0 0"


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def tree(
    tmp_path: Path,
    online: str = "0-7",
    meminfo: str = MEMINFO,
    loadavg: str = "1.00 0.50 0.25 2/300 4000",
    interrupts: str = INTERRUPTS,
) -> ProbeContext:
    sys, proc = tmp_path / "sys", tmp_path / "proc"
    write(sys, "devices/system/cpu/online", online)
    write(proc, "meminfo", meminfo)
    write(proc, "loadavg", loadavg)
    write(proc, "interrupts", interrupts)
    return ProbeContext(node_name="node1", sysfs_root=sys, procfs_root=proc)


def proc_state(ctx: ProbeContext, pid: int, state: str, start: int = 100) -> None:
    fields = f"{state} 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0"
    write(ctx.procfs_root, f"{pid}/stat", f"{pid} (worker) {fields}")


def edac(ctx: ProbeContext, mc: str, ce: int, ue: int) -> None:
    write(ctx.sysfs_root, f"devices/system/edac/mc/{mc}/ce_count", str(ce))
    write(ctx.sysfs_root, f"devices/system/edac/mc/{mc}/ue_count", str(ue))


def probe(ctx: ProbeContext, **cfg: object) -> CpuProbe:
    return CpuProbe(CpuConfig.model_validate(cfg), ctx)


def codes(p: CpuProbe) -> list[str]:
    return [f.code for f in p.check().findings]


# --- parsers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "count"), [("0", 1), ("0-3", 4), ("0-3,5,7-8\n", 7), ("", 0), ("0-127", 128)]
)
def test_parse_cpu_list(text: str, count: int) -> None:
    assert parse_cpu_list(text) == count


def test_parse_meminfo() -> None:
    mem = parse_meminfo(MEMINFO)
    assert mem["MemTotal"] == 64 * GIB_KB
    assert mem["HugePages_Total"] == 0
    assert "Bogus" not in mem


def test_parse_loadavg() -> None:
    assert parse_loadavg("12.50 3.00 0.10 5/600 7777\n") == (12.5, 3.0, 0.1)


def test_parse_mce_count() -> None:
    assert parse_mce_count(INTERRUPTS) == 0
    assert parse_mce_count(INTERRUPTS.replace("MCE:          0", "MCE:          3")) == 3
    assert parse_mce_count("  0: 1 2 timer\n") is None


def test_parse_stat_state_survives_parentheses_in_the_name() -> None:
    assert parse_stat_state(STAT) == ("S", 98765)
    assert parse_stat_state("garbage") is None


# --- healthy and failures ------------------------------------------------------------------


def test_healthy_node(tmp_path: Path) -> None:
    ctx = tree(tmp_path)
    proc_state(ctx, 10, "S")
    edac(ctx, "mc0", 5, 0)
    p = probe(ctx, expected_cpus=8, expected_mem_gib=64)
    assert p.check().status is Status.OK
    out = p.check()
    assert out.status is Status.OK
    assert out.message == "8 CPUs online"


def test_missing_cpus_fail(tmp_path: Path) -> None:
    out = probe(tree(tmp_path, online="0-5"), expected_cpus=8).check()
    assert out.status is Status.FAIL
    (finding,) = out.findings
    assert (finding.code, finding.action) == ("cpu_missing", Action.REBOOT)
    assert "6 CPUs online, expected 8" in finding.message


def test_missing_memory_fails_beyond_tolerance(tmp_path: Path) -> None:
    ctx = tree(tmp_path)
    assert probe(ctx, expected_mem_gib=66).check().status is Status.OK  # within 5%
    out = probe(ctx, expected_mem_gib=128).check()
    assert out.findings[0].code == "mem_missing"
    assert out.findings[0].action is Action.REPLACE


def test_low_available_memory_and_swap_warn(tmp_path: Path) -> None:
    meminfo = (
        f"MemTotal: {64 * GIB_KB} kB\nMemAvailable: {GIB_KB} kB\n"
        "SwapTotal: 1000 kB\nSwapFree: 100 kB\n"
    )
    out = probe(tree(tmp_path, meminfo=meminfo)).check()
    assert out.status is Status.WARN
    assert [f.code for f in out.findings] == ["mem_low", "swap_high"]
    assert "90% swap used" in out.message


def test_high_load_per_cpu_warns(tmp_path: Path) -> None:
    out = probe(tree(tmp_path, online="0-1", loadavg="9.0 1 1 1/1 1")).check()
    assert [f.code for f in out.findings] == ["load_high"]
    assert "4.5 per CPU" in out.message


def test_corrected_errors_warn_on_growth_only(tmp_path: Path) -> None:
    ctx = tree(tmp_path)
    edac(ctx, "mc0", 1000, 0)
    p = probe(ctx)
    assert codes(p) == []
    edac(ctx, "mc0", 1003, 0)
    assert codes(p) == ["mem_ce"]
    assert codes(p) == []


def test_uncorrectable_errors_always_fail(tmp_path: Path) -> None:
    ctx = tree(tmp_path)
    edac(ctx, "mc1", 0, 2)
    out = probe(ctx).check()
    assert out.status is Status.FAIL
    (finding,) = out.findings
    assert (finding.component, finding.code, finding.action) == ("mc1", "mem_ue", Action.REPLACE)


def test_machine_check_growth_warns(tmp_path: Path) -> None:
    ctx = tree(tmp_path)
    p = probe(ctx)
    assert codes(p) == []
    write(ctx.procfs_root, "interrupts", INTERRUPTS.replace("MCE:          0", "MCE:          2"))
    assert codes(p) == ["mce"]


def test_d_state_counts_only_processes_stuck_across_runs(tmp_path: Path) -> None:
    ctx = tree(tmp_path)
    for pid in range(100, 103):
        proc_state(ctx, pid, "D")
    p = probe(ctx, d_state_warn=3)
    assert codes(p) == []  # first sample: could be ordinary short waits
    assert codes(p) == ["d_state"]
    proc_state(ctx, 102, "D", start=999)  # pid reused by a new process: not the same one
    assert codes(p) == []


def test_read_d_state_ignores_non_pid_entries(tmp_path: Path) -> None:
    ctx = tree(tmp_path)
    proc_state(ctx, 7, "D", start=5)
    proc_state(ctx, 8, "R")
    write(ctx.procfs_root, "9/stat", "truncated")
    assert read_d_state(ctx.procfs_root) == {(7, 5)}


def test_no_edac_and_no_mce_row_is_fine(tmp_path: Path) -> None:
    assert probe(tree(tmp_path, interrupts="  0: 1 timer")).check().status is Status.OK


# --- errors and config ---------------------------------------------------------------------


def test_missing_cpu_online_raises(tmp_path: Path) -> None:
    ctx = tree(tmp_path)
    (ctx.sysfs_root / "devices/system/cpu/online").unlink()
    with pytest.raises(FileNotFoundError):
        probe(ctx).check()


def test_missing_meminfo_raises(tmp_path: Path) -> None:
    ctx = tree(tmp_path)
    (ctx.procfs_root / "meminfo").unlink()
    with pytest.raises(FileNotFoundError):
        probe(ctx).check()


def test_against_the_real_host() -> None:
    out = CpuProbe(CpuConfig(), ProbeContext(node_name="host")).check()
    assert out.status in (Status.OK, Status.WARN)
    assert "CPUs online" in out.message or out.findings


@pytest.mark.parametrize(
    "cfg",
    [
        {"expected_cpus": 0},
        {"expected_mem_gib": -1},
        {"expected_mem_gib": 2e6},
        {"mem_tolerance_pct": 100},
        {"d_state_warn": 0},
        {"nope": True},
    ],
)
def test_config_rejects_bad_values(cfg: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CpuConfig.model_validate(cfg)
