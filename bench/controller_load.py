"""Controller ingest under simulated agents: 1,000 / 5,000 / 10,000 nodes.

Starts ``hyperpod controller run`` as a subprocess on a loopback port (fresh state
database, against the local cluster's Slurm when ``--cluster-dir`` is given), then per
scale:

1. registration: every simulated node posts one full report (32 connections, as
   fast as the controller takes them) -> report ingest throughput;
2. steady state: open-loop heartbeats at ``nodes / interval`` per second (30 s
   agent heartbeat), 1 % of them full reports, for ``--duration`` seconds. Latency
   is measured from each request's *scheduled* time, so queueing counts.

Controller CPU (utime+stime from /proc) and RSS are sampled around the steady phase.
The load generator shares the machine: on 2 cores its own CPU is reported too.

    .venv/bin/python bench/controller_load.py --cluster-dir /var/tmp/hp-x --auth munge
    .venv/bin/python bench/controller_load.py --auth none --nodes 1000 --duration 10
    ... --write-docs docs/benchmarks.md

Target: 10,000 nodes at a 30 s heartbeat (333 req/s), p99 < 100 ms on 2 cores.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import queue
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hyperpod_agent.auth import AuthConfig, ClientAuth  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
START, END = "<!-- controller-load:start -->", "<!-- controller-load:end -->"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:13]) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class Agents:
    """Simulated agents: per-thread keep-alive connections, signed requests."""

    def __init__(self, port: int, auth: AuthConfig) -> None:
        self.port = port
        self.auth = auth
        self.local = threading.local()
        self.seq: dict[str, int] = {}
        self.lock = threading.Lock()
        self.agent_id = f"bench-{os.getpid()}-{int(time.time())}"
        self.clients: dict[str, ClientAuth] = {}

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            self.local.conn = conn
        return conn

    def _next(self, node: str) -> int:
        with self.lock:
            self.seq[node] = self.seq.get(node, 0) + 1
            return self.seq[node]

    def body(self, node: str, kind: str) -> tuple[str, bytes]:
        now = datetime.now(UTC).isoformat()
        seq = self._next(node)
        if kind == "heartbeat":
            data = {"node": node, "agent_id": self.agent_id, "seq": seq, "sent_at": now}
            return "/v1/heartbeats", json.dumps(data).encode()
        data = {
            "node": node,
            "agent_id": self.agent_id,
            "seq": seq,
            "generated_at": now,
            "verdict": "healthy",
            "results": [
                {"probe": p, "status": "OK", "at": now, "duration_s": 0.01}
                for p in ("gpu", "nic", "disk", "cpu", "slurmd")
            ],
        }
        return "/v1/reports", json.dumps(data).encode()

    def send(self, node: str, kind: str) -> int:
        path, data = self.body(node, kind)
        client = self.clients.get(node)
        if client is None:
            client = self.clients.setdefault(node, ClientAuth(self.auth, node))
        headers = {"content-type": "application/json", **client.headers("POST", path, data)}
        for attempt in (1, 2):
            conn = self._conn()
            try:
                conn.request("POST", path, body=data, headers=headers)
                resp = conn.getresponse()
                resp.read()
                return resp.status
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        return 0


def run_pool(
    agents: Agents, jobs: list[tuple[float, str, str]], workers: int, open_loop: bool
) -> tuple[list[float], dict[int, int], float]:
    """Send jobs (scheduled_at, node, kind); latencies from schedule (open loop)."""
    q: queue.Queue[tuple[float, str, str] | None] = queue.Queue()
    lat: list[float] = []
    codes: dict[int, int] = {}
    lock = threading.Lock()

    def worker() -> None:
        while True:
            item = q.get()
            if item is None:
                return
            at, node, kind = item
            if open_loop:
                delay = at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            start = at if open_loop else time.monotonic()
            try:
                code = agents.send(node, kind)
            except (OSError, http.client.HTTPException):
                code = -1
            took = time.monotonic() - start
            with lock:
                lat.append(took)
                codes[code] = codes.get(code, 0) + 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    began = time.monotonic()
    for job in jobs:
        if open_loop:  # feed just ahead of schedule so the queue order is the schedule
            while job[0] - time.monotonic() > 0.05:
                time.sleep(0.01)
        q.put(job)
    for _ in threads:
        q.put(None)
    for t in threads:
        t.join(timeout=600)
    return lat, codes, time.monotonic() - began


def start_controller(work: Path, port: int, auth: AuthConfig, slurm_conf: str | None) -> Any:
    lines = [
        f"listen_port = {port}",
        f'state_db = "{work / "state.db"}"',
        "reconcile_interval_s = 10",
        'log_level = "WARNING"',
        "[auth]",
        f'mode = "{auth.mode}"',
    ]
    if auth.munge_socket:
        lines += [
            f'munge_socket = "{auth.munge_socket}"',
            # simulated nodes are not in Slurm: nothing to check their origin against
            "check_origin = false",
        ]
    if slurm_conf:
        lines.insert(0, f'slurm_conf = "{slurm_conf}"')
    cfg = work / "controller.toml"
    cfg.write_text("\n".join(lines) + "\n")
    log = (work / "controller.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hyperpod_agent.controller.cli", "run", "--config", str(cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v1/healthz")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"controller did not start: {(work / 'controller.log').read_text()}")


def bench_scale(n: int, args: argparse.Namespace, auth: AuthConfig) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hp-ctl-bench-") as tmp:
        proc = start_controller(Path(tmp), args.port, auth, args.slurm_conf)
        try:
            agents = Agents(args.port, auth)
            nodes = [f"sim{i:05d}" for i in range(n)]
            lat, codes, took = run_pool(agents, [(0.0, x, "report") for x in nodes], 32, False)
            register = {
                "reports": n,
                "seconds": round(took, 2),
                "per_s": round(n / took, 1),
                "p50_ms": round(pct(lat, 50) * 1e3, 1),
                "p99_ms": round(pct(lat, 99) * 1e3, 1),
                "codes": codes,
            }
            rate = n / args.interval
            total = int(rate * args.duration)
            t0 = time.monotonic() + 0.5
            jobs = [
                (t0 + i / rate, nodes[i % n], "report" if i % 100 == 99 else "heartbeat")
                for i in range(total)
            ]
            cpu0, self0, w0 = cpu_seconds(proc.pid), time.process_time(), time.monotonic()
            lat, codes, took = run_pool(agents, jobs, args.workers, True)
            wall = time.monotonic() - w0
            return {
                "nodes": n,
                "register": register,
                "steady": {
                    "target_per_s": round(rate, 1),
                    "requests": len(lat),
                    "achieved_per_s": round(len(lat) / took, 1),
                    "p50_ms": round(pct(lat, 50) * 1e3, 1),
                    "p99_ms": round(pct(lat, 99) * 1e3, 1),
                    "max_ms": round(max(lat) * 1e3, 1),
                    "codes": codes,
                },
                "controller_cpu_pct": round(100 * (cpu_seconds(proc.pid) - cpu0) / wall, 1),
                "controller_rss_mb": round(rss_mb(proc.pid), 1),
                "loadgen_cpu_pct": round(100 * (time.process_time() - self0) / wall, 1),
            }
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| nodes | register reports/s | steady req/s (target) | p50 ms | p99 ms | max ms "
        "| controller CPU % | controller RSS MB | load generator CPU % | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["steady"]
        bad = sum(v for k, v in {**s["codes"], **r["register"]["codes"]}.items() if int(k) != 200)
        rows.append(
            f"| {r['nodes']:,} | {r['register']['per_s']} | {s['achieved_per_s']} "
            f"({s['target_per_s']}) | {s['p50_ms']} | {s['p99_ms']} | {s['max_ms']} | "
            f"{r['controller_cpu_pct']} | {r['controller_rss_mb']} | "
            f"{r['loadgen_cpu_pct']} | {bad} |"
        )
    return "\n".join(rows)


def write_docs(path: Path, text: str) -> None:
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{START}\n{text}\n{END}"
    if START in old and END in old:
        new = old[: old.index(START)] + block + old[old.index(END) + len(END) :]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="1000,5000,10000")
    parser.add_argument("--interval", type=float, default=30.0, help="heartbeat period, s")
    parser.add_argument("--duration", type=float, default=30.0, help="steady phase, s")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--port", type=int, default=23990)
    parser.add_argument("--auth", choices=["none", "munge"], default="munge")
    parser.add_argument(
        "--cluster-dir",
        type=Path,
        default=None,
        help="local cluster: its slurm.conf and munge socket",
    )
    parser.add_argument("--write-docs", type=Path, default=None)
    args = parser.parse_args()
    args.slurm_conf = None
    socket_path = None
    if args.cluster_dir is not None:
        args.slurm_conf = str(args.cluster_dir / "etc" / "slurm.conf")
        socket_path = args.cluster_dir / "munge" / "munge.sock"
    auth = AuthConfig(mode=args.auth, munge_socket=socket_path if args.auth == "munge" else None)
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    results = []
    for n in (int(x) for x in args.nodes.split(",")):
        result = bench_scale(n, args, auth)
        print(json.dumps(result), flush=True)
        results.append(result)
    exe = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else "python"
    command = " ".join([exe, *(shlex.quote(a) for a in sys.argv)])
    text = (
        f"## Controller ingest (bench/controller_load.py)\n\n"
        f"`{command}`\n\n{datetime.now(UTC):%Y-%m-%d}, {platform.node()}, "
        f"{os.cpu_count()} cores shared with the load generator and other work; "
        f"auth mode `{args.auth}`; heartbeat every {args.interval:g} s, 1 % full "
        f"reports; steady phase {args.duration:g} s per scale; latency from the "
        f"scheduled send time (open loop).\n\n{table(results)}\n"
    )
    print(text)
    if args.write_docs:
        write_docs(args.write_docs, text)


if __name__ == "__main__":
    main()
