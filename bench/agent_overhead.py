"""How much CPU and memory the agent costs a node.

Runs ``hyperpod agent run`` as a subprocess with every probe enabled (GPUs faked by an
8-GPU scenario) at 5 s and 1 s cadence, and reads its CPU time (utime+stime, plus
waited-for children, from /proc/PID/stat) and peak RSS (VmHWM) after a warm-up.

    .venv/bin/python bench/agent_overhead.py            # 120 s per cadence
    .venv/bin/python bench/agent_overhead.py --quick    # 20 s per cadence
    .venv/bin/python bench/agent_overhead.py --write-docs docs/benchmarks.md

Targets at 5 s cadence: <= 0.5 % of one core, <= 60 MB RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
START, END = "<!-- agent-overhead:start -->", "<!-- agent-overhead:end -->"


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICKS


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seq(cache: Path) -> int:
    try:
        return int(json.loads(cache.read_text())["seq"])
    except (OSError, ValueError, KeyError):
        return -1


def write_config(d: Path, cadence: float) -> Path:
    (d / "scenario.json").write_text(json.dumps({"generate": 8}))
    (d / "kmsg").write_text("")
    probes = "".join(
        f"[probes.{name}]\ninterval_s = {cadence}\n"
        for name in ("nic", "disk", "cpu", "slurmd", "script")
    )
    cfg = d / "agent.toml"
    cfg.write_text(f"""
node_name = "bench1"
cache_path = "{d / "health.json"}"
cycle_s = {cadence}
[metrics]
port = {free_port()}
[verdict]
grace_s = 0
[health_check]
stale_after_s = {max(60, 3 * cadence)}
[probes.gpu]
backend = "fake"
fake_scenario = "{d / "scenario.json"}"
kmsg_path = "{d / "kmsg"}"
expected_count = 8
interval_s = {cadence}
{probes}""")
    return cfg


def measure(cadence: float, duration: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="hp-bench-") as tmp:
        d = Path(tmp)
        cfg = write_config(d, cadence)
        cmd = [
            sys.executable,
            "-m",
            "hyperpod_agent.agent.cli",
            "run",
            "--config",
            str(cfg),
            "--log-level",
            "warning",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while seq(d / "health.json") < 2:  # warm-up: imports and first cycles
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("agent did not start")
                time.sleep(0.1)
            cpu0, seq0, t0 = cpu_seconds(proc.pid), seq(d / "health.json"), time.monotonic()
            time.sleep(duration)
            cpu1, seq1, t1 = cpu_seconds(proc.pid), seq(d / "health.json"), time.monotonic()
            rss = peak_rss_mb(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    cycles = max(seq1 - seq0, 1)
    return {
        "cadence_s": cadence,
        "duration_s": t1 - t0,
        "cycles": cycles,
        "cpu_ms_per_cycle": 1000 * (cpu1 - cpu0) / cycles,
        "core_pct": 100 * (cpu1 - cpu0) / (t1 - t0),
        "peak_rss_mb": rss,
    }


def table(rows: list[dict[str, float]]) -> str:
    head = (
        "| cadence | measured | cycles | CPU per cycle | % of one core | peak RSS |\n"
        "|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {r['cadence_s']:g} s | {r['duration_s']:.0f} s | {r['cycles']:.0f} | "
        f"{r['cpu_ms_per_cycle']:.1f} ms | {r['core_pct']:.2f} % | {r['peak_rss_mb']:.1f} MB |\n"
        for r in rows
    )


def write_docs(path: Path, rows: list[dict[str, float]], command: str) -> None:
    section = (
        f"{START}\n## Agent overhead\n\n"
        "The agent with every probe enabled (gpu on an 8-GPU fake scenario, nic, disk, cpu,\n"
        "slurmd, script), one verdict cycle per probe interval, cache written every cycle,\n"
        "metrics served. CPU includes waited-for child processes.\n\n"
        f"Command: `{command}`\n\n"
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, Linux {platform.release()} "
        f"(shared with other work while measured).\n\n{table(rows)}\n"
        "Targets at 5 s cadence: at most 0.5 % of one core and 60 MB RSS.\n"
        f"{END}\n"
    )
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    if START in text and END in text:
        before, rest = text.split(START, 1)
        text = before + section + rest.split(END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds per cadence")
    parser.add_argument("--quick", action="store_true", help="20 s per cadence")
    parser.add_argument("--cadences", default="5,1", help="comma-separated seconds")
    parser.add_argument("--write-docs", type=Path, default=None)
    args = parser.parse_args()
    duration = 20.0 if args.quick else args.duration
    rows = [measure(float(c), duration) for c in args.cadences.split(",")]
    sys.stdout.write(table(rows))
    if args.write_docs:
        write_docs(args.write_docs, rows, " ".join([os.path.relpath(sys.executable), *sys.argv]))


if __name__ == "__main__":
    main()
