"""Controller failover: how long a cluster goes without a leader when one dies, and
how long a fault that arrives meanwhile waits.

One local cluster started with ``--with-services --ha`` (2 nodes; PostgreSQL and two
controllers at the shipped lease: TTL 4 s, renewed every second). Each of ``--kills`` rounds:

  kill -9 the leader at t0 and, at the same instant, take a node's data link down (a
  fault that arrives while nobody leads; its agent reports it at once);
  takeover  t0 -> the other controller's ``hyperpod_controller_leader`` gauge reads 1;
  handled   t0 -> the node out of service in Slurm (the new leader's reboot);
then the link comes back with the fake reboot, the node returns to service, and the
killed controller restarts as the standby.

Then ``--starts`` rounds of both controllers stopped and started at the same instant:
the number of controllers leading, and of takeovers the event log records, must be
one each time.

    .venv/bin/python bench/failover.py --kills 20 --starts 20
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import threading
import time
from pathlib import Path

from hyperpod_agent.controller.config import load_config
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.localcluster import drill, ha
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.localcluster.services import Services
from hyperpod_agent.slurm.client import SlurmClient

BASE = Path("/var/tmp/hyperpod-bench-failover")
PORT_BASE = 18617
VICTIM = "node2"
POLL_S = 0.02


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def gauge(services: Services, name: str) -> float | None:
    return ha.leader_gauge(services.url_of(name))


def leaders(services: Services) -> list[str]:
    return [c for c in services.controllers if gauge(services, c) == 1.0]


def one_leader(services: Services, timeout: float = 30.0) -> str:
    found = drill.wait_for(
        "one controller leading", timeout, lambda: (x := leaders(services)) and len(x) == 1 and x
    )
    return found[0]


def until(what: str, probe: object, timeout: float = 60.0) -> float:
    """Seconds (monotonic clock) at which ``probe()`` first held; polled tightly."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():  # type: ignore[operator]
            return time.monotonic()
        time.sleep(POLL_S)
    raise TimeoutError(f"{what}: not within {timeout:g} s")


def kill_round(cluster: LocalCluster, slurm: SlurmClient) -> tuple[float, float]:
    services = cluster.services
    leader = one_leader(services)
    standby = next(c for c in services.controllers if c != leader)
    pid = services.pid(leader)
    assert pid is not None
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    services.set_link(VICTIM, False)
    took = until("takeover", lambda: gauge(services, standby) == 1.0)
    handled = until("fault handled", lambda: drill.out_of_service(slurm, VICTIM))
    services.start_controller(name=leader)
    # Back to the start: the fake reboot restores the link, the node returns to service
    # and its agent's report closes the fault (else the next round's fault would count
    # as this one surviving its reboot, and escalate).
    drill.wait_for(
        f"{VICTIM} back in service with its fault closed",
        120,
        lambda: (
            (n := slurm.node(VICTIM)).state == "IDLE"
            and not n.drained
            and not n.reason
            and open_faults(cluster, VICTIM) == 0
        ),
        interval=0.5,
    )
    return took - t0, handled - t0


def start_round(cluster: LocalCluster, slurm: SlurmClient) -> tuple[int, int]:
    """Both controllers stopped, then started at once; (leaders, takeover events)."""
    services = cluster.services
    for name in services.controllers:
        services.stop(name)
    before = takeover_events(cluster)
    threads = [
        threading.Thread(target=services.start_controller, kwargs={"name": n})
        for n in services.controllers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    one_leader(services)
    # A second leader, had there been one, would show within a renew period: look longer.
    seen: set[str] = set()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        now = leaders(services)
        seen.update(now)
        if len(now) > 1:
            break
        time.sleep(0.05)
    return len(seen), takeover_events(cluster) - before


def shared_store(cluster: LocalCluster) -> Store:
    config = load_config(cluster.dir / "etc" / "controller.toml")
    return Store(config.store_location())


def takeover_events(cluster: LocalCluster) -> int:
    store = shared_store(cluster)
    try:
        return sum(1 for e in store.events(limit=100_000) if e.kind == "leader")
    finally:
        store.close()


def open_faults(cluster: LocalCluster, node: str) -> int:
    store = shared_store(cluster)
    try:
        return sum(1 for f in store.open_faults() if f.node == node)
    finally:
        store.close()


def forget_faults_fast(cluster: LocalCluster) -> None:
    """Every round faults the same link: without this, the second one would count as a
    repeat of the first and escalate to a replacement (policy.escalation_window_s)."""
    services = cluster.services
    for name in services.controllers:
        path = cluster.dir / "etc" / f"{name}.toml"
        text = path.read_text()
        assert "\n[policy]\n" in text, f"{path}: no [policy] table"
        path.write_text(text.replace("\n[policy]\n", "\n[policy]\nescalation_window_s = 1.0\n"))
        services.stop(name)
    for name in services.controllers:
        services.start_controller(name=name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--starts", type=int, default=20)
    args = parser.parse_args()
    cluster = LocalCluster(BASE, nodes=2, spares=0, port_base=PORT_BASE, ha=True)
    cluster.up(timeout=60, services=True)
    try:
        forget_faults_fast(cluster)
        slurm = SlurmClient(slurm_conf=cluster.slurm_conf, timeout=10)
        drill.wait_for("every node idle", 60, lambda: cluster.wait_idle(cluster.nodes) or True)
        takeovers, handled = [], []
        for k in range(args.kills):
            took, done = kill_round(cluster, slurm)
            takeovers.append(took)
            handled.append(done)
            print(f"kill {k + 1:2d}: leading again {took:.2f} s, fault handled {done:.2f} s")
        starts = [start_round(cluster, slurm) for _ in range(args.starts)]
    finally:
        cluster.down()
    print()
    print(f"{'leader killed (kill -9), n=' + str(len(takeovers)):34s} median    p99     max")
    for label, values in (("-> standby leading", takeovers), ("-> fault handled", handled)):
        print(
            f"  {label:32s} {statistics.median(values):5.2f} s {pct(values, 99):5.2f} s "
            f"{max(values):5.2f} s"
        )
    one = sum(1 for n, ev in starts if n == 1 and ev == 1)
    print(f"both started at once: exactly one leader (and one takeover) {one}/{len(starts)}")
    bad = [s for s in starts if s != (1, 1)]
    if bad:
        print(f"  rounds that were not: (leaders, takeovers) = {bad}")


if __name__ == "__main__":
    main()
