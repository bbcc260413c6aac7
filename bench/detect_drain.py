"""Fault -> node taken out of service in Slurm: latency.

Default mode: runs ``hyperpod controller run`` against a local cluster (``hyperpod
local-cluster up``), posts a faulty report for one node over loopback HTTP with MUNGE
authentication and polls ``scontrol show node`` until Slurm shows the node drained with
our reason; then a healthy report and the wait for the resume. Repeats ``--trials`` times.

    .venv/bin/python bench/detect_drain.py --cluster-dir /var/tmp/hp-x --trials 20
    ... --write-docs docs/benchmarks.md

``--agents`` mode: the whole path with real agents, on a cluster started with
``hyperpod local-cluster up --with-services``: an XID 79 is written into a node's fake
GPU scenario, its agent finds it, reports, the controller asks Slurm for a reboot; the
latency is until ``sinfo`` (polled every 50 ms) shows the node out with our reason,
then until the fake reboot has it idle again (see bench/detect_drain_agents.py).

    .venv/bin/python bench/detect_drain.py --agents --cluster-dir /var/tmp/hp-x \\
        --trials 20 --write-docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hyperpod_agent.auth.client import ClientAuth  # noqa: E402
from hyperpod_agent.auth.config import AuthConfig  # noqa: E402
from hyperpod_agent.slurm.client import SlurmClient  # noqa: E402

START, END = "<!-- detect-drain:start -->", "<!-- detect-drain:end -->"


def post(port: int, auth: ClientAuth, path: str, body: dict[str, object]) -> int:
    data = json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(
            "POST",
            path,
            body=data,
            headers={"content-type": "application/json", **auth.headers("POST", path, data)},
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def wait(check: object, timeout: float = 30.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.01)
    raise SystemExit(f"timed out after {timeout:g} s")


def report(node: str, seq: int, faulty: bool) -> dict[str, object]:
    now = datetime.now(UTC).isoformat()
    findings = (
        [
            {
                "component": "gpu0",
                "code": "xid46",
                "status": "FAIL",
                "action": "RESET",
                "message": "bench",
            }
        ]
        if faulty
        else []
    )
    return {
        "node": node,
        "agent_id": f"bench-{os.getpid()}",
        "seq": seq,
        "generated_at": now,
        "verdict": "faulty" if faulty else "healthy",
        "confirmed": [
            {"probe": "gpu", "component": f["component"], "code": f["code"]} for f in findings
        ],
        "results": [
            {"probe": "gpu", "status": "FAIL" if faulty else "OK", "findings": findings, "at": now}
        ],
    }


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cluster-dir", type=Path, required=True)
    parser.add_argument("--node", default="node2")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--port", type=int, default=23991)
    parser.add_argument("--write-docs", type=Path, default=None)
    parser.add_argument(
        "--agents", action="store_true", help="real agents on a --with-services cluster"
    )
    parser.add_argument("--max-seconds", type=float, default=600.0, help="--agents: time cap")
    args = parser.parse_args()
    if args.agents:
        from detect_drain_agents import run_agents

        run_agents(args, pct, update_docs)
        return
    conf = args.cluster_dir / "etc" / "slurm.conf"
    sock = args.cluster_dir / "munge" / "munge.sock"
    slurm = SlurmClient(conf)
    auth = AuthConfig(mode="munge", munge_socket=sock)
    client = ClientAuth(auth, args.node)
    drains, resumes = [], []
    with tempfile.TemporaryDirectory(prefix="hp-detect-") as tmp:
        cfg = Path(tmp) / "c.toml"
        cfg.write_text(
            f'listen_port = {args.port}\nstate_db = "{tmp}/s.db"\n'
            f'slurm_conf = "{conf}"\nreconcile_interval_s = 10\n'
            f'[auth]\nmode = "munge"\nmunge_socket = "{sock}"\n'
            "[policy]\nmax_unhealthy_fraction = 0.5\ncooldown_s = 0\n"
            # the same fault 20 times in a row would (rightly) escalate to a reboot and
            # hold the node as a lemon: measure the first reaction every time
            "escalation_window_s = 0.001\nlemon_threshold = 1000000\n"
            + os.environ.get("BENCH_EXTRA", "")
        )
        env = {**os.environ, "SLURM_CONF": str(conf)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "hyperpod_agent.controller.cli", "run", "--config", str(cfg)],
            env=env,
        )
        try:
            time.sleep(2)
            for i in range(args.trials):
                post(args.port, client, "/v1/reports", report(args.node, 2 * i + 1, True))
                drains.append(
                    wait(lambda: slurm.node(args.node).reason.startswith("hyperpod:reset"))
                )
                post(args.port, client, "/v1/reports", report(args.node, 2 * i + 2, False))
                resumes.append(wait(lambda: not slurm.node(args.node).drained))
                # Slurm flags a just-resumed node NOT_RESPONDING until its next ping, and the
                # policy resumes only responding nodes: start the next trial from a settled node
                wait(lambda: slurm.node(args.node).responding)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
    exe = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else "python"
    command = " ".join([exe, *(shlex.quote(a) for a in sys.argv)])
    text = (
        "## Fault report to drain (bench/detect_drain.py)\n\n"
        f"`{command}`\n\n{datetime.now(UTC):%Y-%m-%d}, 2 shared cores, real local Slurm, MUNGE "
        f"auth, reconcile interval 10 s (a fault report wakes the loop at once), escalation "
        f"and lemon tracking off so every trial is a first fault; latency "
        f"from the POST to `scontrol show node` showing the change (polled every 10 ms).\n\n"
        "| | trials | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n"
        f"| faulty report -> drained | {len(drains)} | {pct(drains, 50) * 1e3:.0f} | "
        f"{pct(drains, 99) * 1e3:.0f} | {max(drains) * 1e3:.0f} |\n"
        f"| healthy report -> resumed | {len(resumes)} | {pct(resumes, 50) * 1e3:.0f} | "
        f"{pct(resumes, 99) * 1e3:.0f} | {max(resumes) * 1e3:.0f} |\n"
    )
    print(text)
    if args.write_docs:
        update_docs(args.write_docs, START, END, text)


def update_docs(path: Path, start: str, end: str, text: str) -> None:
    """Replace the block between ``start`` and ``end`` in ``path`` (append it if absent)."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{start}\n{text}{end}"
    if start in old and end in old:
        new = old[: old.index(start)] + block + old[old.index(end) + len(end) :]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


if __name__ == "__main__":
    main()
