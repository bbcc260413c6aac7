"""``detect_drain.py --agents``: XID 79 in a node's GPUs -> node out in Slurm, real agents.

On a local cluster started with ``--with-services`` (a controller with MUNGE
authentication, an agent per node on fake GPUs). Each trial appends an XID 79 to one
node's GPU scenario (nodes taken in turn), then polls ``sinfo`` every 50 ms:

- *detect*: scenario written -> ``sinfo`` shows the node with a ``hyperpod:`` reason
  (drained for reboot, or reboot issued): agent probe cadence (1 s) + verdict + report
  + controller pass + ``scontrol reboot``;
- *back*: scenario written -> the fake reboot done and the node idle without a reason.

Between trials the node is settled: idle, responding, its new agent healthy. For the
run, the controller's config gets a tiny escalation window and a huge lemon threshold
(the same XID on the same node 5 times would rightly escalate to a replacement and hold
the node as a lemon; every trial here is meant as a first fault); the file is put back
afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from hyperpod_agent.localcluster import procs
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.localcluster.services import to_toml

START, END = "<!-- detect-drain-agents:start -->", "<!-- detect-drain-agents:end -->"
POLL_S = 0.05
POLICY_PATCH = {"escalation_window_s": 0.001, "lemon_threshold": 1_000_000}


class Timeout(Exception):
    pass


def sinfo(env: dict[str, str], node: str) -> tuple[str, str]:
    """(state, reason) of ``node`` as ``sinfo`` prints them."""
    res = subprocess.run(
        ["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"],
        capture_output=True,
        text=True,
        timeout=5,
        env=env,
        check=False,
    )
    state, _, reason = res.stdout.strip().partition("|")
    return state, "" if reason == "none" else reason


def wait(check: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(POLL_S)
    raise Timeout(f"timed out after {timeout:g} s waiting for {what}")


def shows(env: dict[str, str], node: str, out: bool) -> Callable[[], bool]:
    """``sinfo`` shows ``node`` out for a reboot by us (``out``), or idle with no reason."""
    if out:
        return lambda: sinfo(env, node)[1].startswith("hyperpod:reboot")
    return lambda: sinfo(env, node) == ("idle", "")


def inject_xid79(path: Path, gpu: int) -> None:
    scenario = json.loads(path.read_text())
    events = list(scenario.get("xid_events", []))
    events.append({"gpu": gpu, "xid": 79, "id": f"bench-{time.time_ns()}"})
    scenario["xid_events"] = events
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(scenario) + "\n")
    os.replace(tmp, path)  # the agent must never read half a file


def agent_healthy(cache: Path) -> bool:
    try:
        return bool(json.loads(cache.read_text()).get("verdict") == "healthy")
    except (OSError, ValueError):
        return False


def rehome(cluster: LocalCluster, node: str) -> None:
    """Restart a fake-rebooted slurmd in our own time namespace: the harness's pid-file
    checks fail inside the node's time namespace, where the next reboot would run
    (see tests/integration/test_fault_drills.py); Slurm keeps the node IDLE."""
    pid = cluster.slurmd_pid(node)
    if pid is None:
        return
    try:
        theirs = os.readlink(f"/proc/{pid}/ns/time")
    except OSError:
        return
    if theirs != os.readlink("/proc/self/ns/time"):
        procs.stop([pid])
        cluster.node_start(node)


def settle(cluster: LocalCluster, env: dict[str, str], node: str, timeout: float) -> None:
    def idle() -> bool:
        state, reason = sinfo(env, node)
        return state == "idle" and not reason

    wait(idle, timeout, f"{node} idle")
    rehome(cluster, node)
    wait(idle, timeout, f"{node} idle after its slurmd restart")
    wait(lambda: agent_healthy(cluster.services.cache(node)), timeout, f"{node}'s agent healthy")


def run_agents(
    args: argparse.Namespace,
    pct: Callable[[list[float], float], float],
    update_docs: Callable[[Path, str, str, str], None],
) -> None:
    """The ``--agents`` mode of detect_drain.py."""
    cluster = LocalCluster.load(args.cluster_dir)
    if not cluster.has_services():
        raise SystemExit(f"{args.cluster_dir}: no hyperpod services (up --with-services)")
    env = {**cluster.env}
    nodes = list(cluster.nodes)
    config = cluster.dir / "etc" / "controller.toml"
    original = config.read_text()
    detect: list[float] = []
    back: list[float] = []
    deadline = time.monotonic() + args.max_seconds
    try:
        data = tomllib.loads(original)
        data["policy"] = {**data.get("policy", {}), **POLICY_PATCH}
        config.write_text(to_toml(data))
        time.sleep(3.0)  # the controller re-reads its config at the next pass (2 s)
        for node in nodes:
            settle(cluster, env, node, 60)
        for i in range(args.trials):
            if time.monotonic() > deadline:
                print(f"time cap {args.max_seconds:g} s reached after {i} trials", file=sys.stderr)
                break
            node = nodes[i % len(nodes)]
            scenario = cluster.services.scenario(node)
            t0 = time.monotonic()
            inject_xid79(scenario, gpu=i % 8)
            wait(shows(env, node, out=True), 30, f"{node} taken out")
            detect.append(time.monotonic() - t0)
            wait(shows(env, node, out=False), 60, f"{node} back")
            back.append(time.monotonic() - t0)
            print(f"trial {i + 1}: {node} out {detect[-1]:.2f} s, back {back[-1]:.2f} s")
            settle(cluster, env, node, 60)
    finally:
        config.write_text(original)
    if not detect:
        raise SystemExit("no trial completed")
    exe = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else "python"
    command = " ".join([exe, *(shlex.quote(a) for a in sys.argv)])
    text = (
        "## XID 79 to node out, real agents (bench/detect_drain.py --agents)\n\n"
        f"`{command}`\n\n{datetime.now(UTC):%Y-%m-%d}, 2 shared cores, real local Slurm, "
        f"controller with MUNGE auth (reconcile every 2 s, woken by fault reports), an agent "
        f"per node (probe cadence 1 s, fake GPUs), nodes {nodes[0]}..{nodes[-1]} in turn. "
        "Each trial appends an XID 79 to the node's GPU scenario; latency from that write "
        f"to `sinfo` (polled every {POLL_S * 1e3:.0f} ms) showing the node out with a "
        "`hyperpod:reboot` reason, and to the node idle again after the fake reboot "
        "(`RebootProgram` restarts its slurmd with a new boot time). Escalation and lemon "
        "tracking off for the run so every trial is a first fault.\n\n"
        "| | trials | p50 s | p95 s | max s |\n|---|---|---|---|---|\n"
        f"| XID 79 -> out (drain + reboot issued) | {len(detect)} | {pct(detect, 50):.2f} | "
        f"{pct(detect, 95):.2f} | {max(detect):.2f} |\n"
        f"| XID 79 -> rebooted and idle | {len(back)} | {pct(back, 50):.2f} | "
        f"{pct(back, 95):.2f} | {max(back):.2f} |\n\n"
        "Target: p50 of XID 79 -> out at most 3 s. The second row is mostly the harness's "
        "fake reboot (its new slurmd starts 2 s after the old one stopped, so slurmctld "
        "always sees a later boot time). The executor reads the node again right before "
        "the reboot (`scontrol show node`: the owner check before any change), which "
        "costs about 0.2 s of the first row.\n"
    )
    print(text)
    if args.write_docs:
        update_docs(args.write_docs, START, END, text)
