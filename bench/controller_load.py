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
    .venv/bin/python bench/controller_load.py --auth none --store sqlite,postgresql
    ... --write-docs docs/benchmarks.md

``--store sqlite,postgresql`` runs every scale on each state store in turn, side by
side in one run: PostgreSQL is a throwaway local server on 127.0.0.1
(hyperpod_agent/localcluster/postgres.py), a fresh database per scale; its server
processes' CPU is reported apart from the controller's.

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

import psutil  # noqa: E402

from hyperpod_agent.auth.client import ClientAuth  # noqa: E402
from hyperpod_agent.auth.config import AuthConfig  # noqa: E402
from hyperpod_agent.localcluster.postgres import PostgresServer, start_postgres  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
PG_PASSWORD = "bench-only"


def markers(stores: list[str]) -> tuple[str, str]:
    """The docs block: the SQLite-only run keeps its own, the comparison another."""
    name = "controller-load" if stores == ["sqlite"] else "controller-load-stores"
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:13]) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def tree_cpu_seconds(pid: int | None) -> float:
    """CPU of a process and its children (the PostgreSQL server's backends)."""
    if pid is None:
        return 0.0
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


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


def store_lines(work: Path, store: str, pg: PostgresServer | None, n: int) -> list[str]:
    """controller.toml lines for ``store``: a SQLite file, or a fresh PostgreSQL database."""
    if store == "sqlite":
        return [f'state_db = "{work / "state.db"}"']
    assert pg is not None
    url = pg.create_database(f"bench_{n}_{os.getpid()}_{int(time.time())}", "bench", PG_PASSWORD)
    password_file = work / "store.password"
    password_file.write_text(PG_PASSWORD + "\n")
    password_file.chmod(0o600)
    return [f'store = "{url}"', f'store_password_file = "{password_file}"']


def start_controller(
    work: Path, port: int, auth: AuthConfig, slurm_conf: str | None, store: list[str]
) -> Any:
    lines = [
        f"listen_port = {port}",
        *store,
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


def bench_scale(
    n: int, args: argparse.Namespace, auth: AuthConfig, store: str, pg: PostgresServer | None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hp-ctl-bench-") as tmp:
        work = Path(tmp)
        lines = store_lines(work, store, pg, n)
        proc = start_controller(work, args.port, auth, args.slurm_conf, lines)
        db_pid = pg.pid if pg is not None and store == "postgresql" else None
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
            db0 = tree_cpu_seconds(db_pid)
            lat, codes, took = run_pool(agents, jobs, args.workers, True)
            wall = time.monotonic() - w0
            return {
                "store": store,
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
                "db_cpu_pct": round(100 * (tree_cpu_seconds(db_pid) - db0) / wall, 1),
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
        "| store | nodes | register reports/s | register p50 ms | register p99 ms "
        "| steady req/s (target) | p50 ms | p99 ms | max ms "
        "| controller CPU % | database server CPU % (steady) | controller RSS MB "
        "| load generator CPU % | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["steady"]
        bad = sum(v for k, v in {**s["codes"], **r["register"]["codes"]}.items() if int(k) != 200)
        g = r["register"]
        db_cpu = r["db_cpu_pct"] if r["store"] == "postgresql" else "-"
        rows.append(
            f"| {r['store']} | {r['nodes']:,} | {g['per_s']} | {g['p50_ms']} | {g['p99_ms']} | "
            f"{s['achieved_per_s']} ({s['target_per_s']}) | {s['p50_ms']} | {s['p99_ms']} | "
            f"{s['max_ms']} | {r['controller_cpu_pct']} | {db_cpu} | "
            f"{r['controller_rss_mb']} | {r['loadgen_cpu_pct']} | {bad} |"
        )
    return "\n".join(rows)


def write_docs(path: Path, text: str, marks: tuple[str, str]) -> None:
    start, end = marks
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{text}\n{end}"
    if start in old and end in old:
        new = old[: old.index(start)] + block + old[old.index(end) + len(end) :]
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
    parser.add_argument(
        "--store", default="sqlite", help="state stores to compare: sqlite,postgresql"
    )
    parser.add_argument("--pg-port", type=int, default=23991, help="the PostgreSQL server's")
    parser.add_argument("--write-docs", type=Path, default=None)
    args = parser.parse_args()
    stores = args.store.split(",")
    if not set(stores) <= {"sqlite", "postgresql"}:
        parser.error("--store takes sqlite and/or postgresql")
    args.slurm_conf = None
    socket_path = None
    if args.cluster_dir is not None:
        args.slurm_conf = str(args.cluster_dir / "etc" / "slurm.conf")
        socket_path = args.cluster_dir / "munge" / "munge.sock"
    auth = AuthConfig(mode=args.auth, munge_socket=socket_path if args.auth == "munge" else None)
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    results = []
    pg = start_postgres(args.pg_port) if "postgresql" in stores else None
    try:
        for n in (int(x) for x in args.nodes.split(",")):
            for store in stores:
                result = bench_scale(n, args, auth, store, pg)
                print(json.dumps(result), flush=True)
                results.append(result)
    finally:
        if pg is not None:
            pg.remove()
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
    if stores != ["sqlite"]:
        text = text.replace(
            "## Controller ingest (bench/controller_load.py)",
            "## Controller ingest by state store (bench/controller_load.py --store)",
        )
    print(text)
    if args.write_docs:
        write_docs(args.write_docs, text, markers(stores))


if __name__ == "__main__":
    main()
