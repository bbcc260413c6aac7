"""What the fake tools print: the real tools' output formats, filled from a scenario.

Written from each tool's print formats (DCGM's JSON writer, nccl-tests' util.cu,
perftest's RESULT_FMT/REPORT_FMT, stress-ng's log lines), so the parsers read a fake
exactly as they read the real thing.
"""

# The tools print with C printf formats; %-formatting keeps them character for character.
# ruff: noqa: UP031

from __future__ import annotations

import json
import os

from hyperpod_agent.deepcheck.fakes.scenario import (
    DcgmiFake,
    NcclFake,
    NvidiaSmiFake,
    StressNgFake,
)

# tests each dcgmi diag level runs, by category (DCGM 4.x names)
DCGM_PLAN: dict[int, list[tuple[str, str]]] = {
    1: [("Deployment", "software")],
    2: [("Deployment", "software"), ("Integration", "pcie"), ("Hardware", "memory")],
}
DCGM_PLAN[3] = DCGM_PLAN[2] + [
    ("Hardware", "diagnostic"),
    ("Stress", "targeted_stress"),
    ("Stress", "targeted_power"),
    ("Stress", "memory_bandwidth"),
]
DCGM_PLAN[4] = DCGM_PLAN[3] + [("Hardware", "pulse_test"), ("Stress", "memtest")]

# dcgmi exits with the DCGM return code, a negative number, as a byte
DCGM_EXIT_NVVS_ERROR = -30 & 0xFF
DCGM_EXIT_CONNECTION = -21 & 0xFF


def _jsoncpp(doc: object) -> str:
    # dcgmi prints with jsoncpp's styled writer: sorted keys, 3 spaces, " : "
    return json.dumps(doc, indent=3, sort_keys=True, separators=(",", " : ")) + "\n"


def dcgm_diag(level: int, cfg: DcgmiFake) -> tuple[str, int]:
    """``dcgmi diag -r <level> -j`` output and exit status."""
    if cfg.runtime_error is not None:
        error = {"DCGM Diagnostic": {"runtime_error": cfg.runtime_error, "version": "4.2.3"}}
        return _jsoncpp(error), DCGM_EXIT_CONNECTION
    failures = {(f.test, f.gpu): f for f in cfg.fail}
    categories: list[dict[str, object]] = []
    failed = False
    for category, test in DCGM_PLAN[level]:
        results, summary_warnings = [], []
        for gpu in range(cfg.gpus):
            result: dict[str, object] = {
                "entity_group": "GPU",
                "entity_group_id": 1,
                "entity_id": gpu,
                "status": "Pass",
            }
            if (test, gpu) in failures:
                message = failures[(test, gpu)].message or (
                    f"Detected 2 volatile double-bit ECC error(s) in GPU {gpu}."
                    if test == "memory"
                    else f"Test {test} failed on GPU {gpu}."
                )
                warning = {
                    "warning": message,
                    "error_id": 4,
                    "error_category": 10,
                    "error_severity": 2,
                }
                result.update(status="Fail", warnings=[warning])
                summary_warnings.append(warning)
            results.append(result)
        summary: dict[str, object] = {"status": "Fail" if summary_warnings else "Pass"}
        if summary_warnings:
            summary["warnings"] = summary_warnings
            failed = True
        entry = {"name": test, "results": results, "test_summary": summary}
        if categories and categories[-1]["category"] == category:
            tests = categories[-1]["tests"]
            assert isinstance(tests, list)
            tests.append(entry)
        else:
            categories.append({"category": category, "tests": [entry]})
    doc: dict[str, object] = {
        "DCGM Diagnostic": {"test_categories": categories},
        "entity_groups": [
            {
                "entity_group": "GPU",
                "entity_group_id": 1,
                "entities": [
                    {"entity_id": g, "device_id": "2330", "serial_num": f"16549220{g:05d}"}
                    for g in range(cfg.gpus)
                ],
            }
        ],
        "metadata": {"version": "4.2.3", "Driver Version Detected": "570.133.20"},
    }
    return _jsoncpp(doc), DCGM_EXIT_NVVS_ERROR if failed else 0


def _width(value: float, width: int) -> str:
    # nccl-tests' getFloatStr: the most decimals that fit the column
    for fmt in (f"%{width}.2f", f"%{width}.1f", f"%{width}.0f"):
        text = fmt % value
        if len(text) <= width:
            return text
    return (f"%{width}.1e" if width >= 7 else f"%{width}.0e") % value


def nccl_all_reduce(
    sizes: list[int], nranks: int, cfg: NcclFake, host: str, pid: int
) -> tuple[str, int]:
    """``all_reduce_perf`` output whose "Avg bus bandwidth" is ``cfg.busbw_gbps`` (0 with
    a single rank, as the real formula 2(n-1)/n gives)."""
    factor = 2 * (nranks - 1) / nranks
    lines = [
        "# nccl-tests version 2.17.1 nccl-headers=22703 nccl-library=22703\n",
        "# Collective test starting: all_reduce_perf\n",
        f"# nThread 1 nGpus {nranks} minBytes {sizes[0]} maxBytes {sizes[-1]} step: 2(factor) "
        "warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n",
        "#\n# Using devices\n",
    ]
    for rank in range(nranks):
        lines.append(
            "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n"
            % (rank, 0, pid, host, rank, 0, 0x18 + 16 * rank, 0, "NVIDIA H100 80GB HBM3")
        )
    head = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n"
    lines.append(
        "#\n# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
        "in-place          \n" % ("", "", "", "", "")
    )
    lines.append(
        head
        % (
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong",
        )
    )
    lines.append(
        head
        % (
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
        )
    )
    # latency-bound small sizes, bandwidth-bound large ones, scaled to the wanted average
    shape = [size / (size + 2**20) for size in sizes]
    mean = sum(shape) / len(shape)
    scale = cfg.busbw_gbps / mean if mean else 0.0
    total_bus = 0.0
    for i, size in enumerate(sizes):
        row = "%12li  %12li  %8s  %6s  %6s" % (size, size // 4, "float", "sum", "%6i" % -1)
        if cfg.cuda_error is not None and i == len(sizes) // 2:
            lines.append(f"{host}: Test CUDA failure common.cu:892 '{cfg.cuda_error}'\n")
            lines.append(f" .. {host} pid {pid}: Test failure common.cu:1040\n")
            return "".join(lines), 2
        for in_place in (False, True):
            # one rank moves data but has no bus bandwidth: 1.75 is 8 ranks' factor
            alg = scale * shape[i] / (factor or 1.75)
            bus = alg * factor
            time_us = size / (alg * 1e3) if alg else 0.0
            wrong = cfg.wrong if in_place and i == len(sizes) - 1 else 0
            row += "  %7s  %6s  %6s  %6g" % (
                _width(time_us, 7),
                _width(alg, 6),
                _width(bus, 6),
                wrong,
            )
            total_bus += bus
        lines.append(row + "\n")
    avg = total_bus / (2 * len(sizes))
    errors = 1 if cfg.wrong else 0
    lines.append(
        "# %-20s : %d %s\n" % ("Out of bounds values", errors, "FAILED" if errors else "OK")
    )
    lines.append("# %-20s : %g %s\n" % ("Avg bus bandwidth", avg, ""))
    lines.append("#\n# Collective test concluded: all_reduce_perf\n#\n\n")
    return "".join(lines), 7 if errors else 0


IB_LINE = "-" * 87 + "\n"
IB_WAITING = (
    "\n************************************\n"
    "* Waiting for client to connect... *\n"
    "************************************\n"
)


def ib_report(device: str, size: int, iterations: int, gbps: float, gbits: bool) -> str:
    """perftest's banner and bandwidth table for one message size."""
    lines = [
        IB_LINE,
        "                    RDMA_Write BW Test\n",
        f" Dual-port       : OFF\t\tDevice         : {device}\n",
        " Number of qps   : 1\t\tTransport type : IB\n",
        " Connection type : RC\t\tUsing SRQ      : OFF\n",
        " TX depth        : 128\n",
        " Mtu             : 4096[B]\n",
        " Link type       : IB\n",
        IB_LINE,
    ]
    unit = "Gb/sec" if gbits else "MiB/sec"
    lines.append(
        f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]\n"
    )
    bytes_per_s = gbps * 1e9 / 8
    average = gbps if gbits else bytes_per_s / 1048576
    rate = bytes_per_s / size / 1e6
    lines.append(
        " %-7d    %-10d       %-7.2f            %-7.2f\t\t     %-7.6f\n"
        % (size, iterations, average * 1.002, average, rate)
    )
    lines.append(IB_LINE)
    return "".join(lines)


def nvlink_status(cfg: NvidiaSmiFake) -> str:
    """``nvidia-smi nvlink --status``."""
    down = {(gpu, link) for gpu, link in cfg.inactive}
    lines = []
    for gpu in range(cfg.gpus):
        lines.append(
            f"GPU {gpu}: NVIDIA H100 80GB HBM3 (UUID: GPU-{gpu:08x}-0b3d-9e1f-6a52-c1d8e0b7a901)\n"
        )
        for link in range(cfg.links):
            state = "<inactive>" if (gpu, link) in down else f"{cfg.link_gbps:g} GB/s"
            lines.append(f"\t Link {link}: {state}\n")
    return "".join(lines)


def stress_ng(cpu: int, vm: int, timeout_s: int, cfg: StressNgFake, pid: int) -> tuple[str, int]:
    """A stress-ng run's log with --metrics-brief, and its exit status."""

    def log(kind: str, message: str, who: int = pid) -> str:
        return f"stress-ng: {kind} [{who}] {message}\n"

    cpu = cpu or os.cpu_count() or 1
    stressors = [(name, n) for name, n in (("cpu", cpu), ("vm", vm)) if n]
    hogs = ", ".join(f"{n} {name}" for name, n in stressors)
    lines = [
        log("info: ", f"setting to a {timeout_s} secs run per stressor"),
        log("info: ", f"dispatching hogs: {hogs}"),
    ]
    if cfg.fail is not None:
        lines.append(log("fail: ", cfg.fail, pid + 1))
        lines.append(
            log(
                "error:",
                f"vm: [{pid + 1}] terminated with an error, exit status=2 (stressor failed)",
            )
        )
    lines.append(
        log(
            "metrc:",
            "%-13s %9.9s %9.9s %9.9s %9.9s %12s %14s"
            % (
                "stressor",
                "bogo ops",
                "real time",
                "usr time",
                "sys time",
                "bogo ops/s",
                "bogo ops/s",
            ),
        )
    )
    lines.append(
        log(
            "metrc:",
            "%-13s %9.9s %9.9s %9.9s %9.9s %12s %14s"
            % ("", "", "(secs) ", "(secs) ", "(secs) ", "(real time)", "(usr+sys time)"),
        )
    )
    for name, n in stressors:
        ops = int(cfg.bogo_ops_per_s * n * timeout_s)
        cpu_s = max(n * timeout_s * 0.99, 0.01)
        lines.append(
            log(
                "metrc:",
                "%-13s %9d %9.2f %9.2f %9.2f %12.2f %14.2f"
                % (name, ops, float(timeout_s), cpu_s, 0.0, ops / timeout_s, ops / cpu_s),
            )
        )
    failed = 1 if cfg.fail is not None else 0
    passed = " ".join(f"{name} ({n - (failed if name == 'vm' else 0)})" for name, n in stressors)
    total = sum(n for _, n in stressors)
    lines += [log("info: ", "skipped: 0"), log("info: ", f"passed: {total - failed}: {passed}")]
    lines.append(log("info: ", f"failed: {failed}" + (": vm (1)" if failed else "")))
    lines.append(log("info: ", "metrics untrustworthy: 0"))
    verdict = "unsuccessful" if failed else "successful"
    lines.append(log("info: ", f"{verdict} run completed in {timeout_s} secs"))
    return "".join(lines), 2 if failed else 0
