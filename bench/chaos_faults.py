"""The chaos campaign's fault catalogue: how each fault lands on the local cluster and
how it heals. A fault draws its target (a node in service, a controller, a running
training job) with the campaign's seed, records an Injection, and schedules its heal.

  xid79 / xid48 / xid94 / xid63   that XID on a GPU of a node in service
  nic_down          the node's network link down; up again 30 s later
  disk_ro / disk_full  the node's scratch mount read-only / full; healed 30 s later
  slurmd_kill       the node's slurmd SIGKILLed; the machine reboots 30 s later
  node_crash        everything on the node SIGKILLed; it comes back 30 s later
  agent_kill        the node's agent SIGKILLed; started again 5 s later
  munge_kill        the cluster's munged SIGKILLed; started again 10 s later
  leader_kill       the leading controller SIGKILLed; started again 10 s later
  leader_stop       the leading controller SIGSTOPped for 2 x its lease, then continued
  postgres_restart  the controllers' PostgreSQL stopped; started again 5 s later
  slurmctld_restart slurmctld stopped (SIGTERM); started again 5 s later
  rank_stop         a running training job's ranks on one of its nodes SIGSTOPped (a
                    hang); continued 120 s later if still there
  double_xid        XID 79 on two nodes of one running training job within a second
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.chaos_evidence import Injection
from hyperpod_agent.localcluster import drill, ha, procs
from hyperpod_agent.localcluster.cluster import LocalCluster

Heal = list[tuple[float, Callable[[], bool]]]

NODE_FAULTS = (
    "xid79",
    "xid48",
    "xid94",
    "xid63",
    "nic_down",
    "disk_ro",
    "disk_full",
    "slurmd_kill",
    "node_crash",
    "agent_kill",
)
CLUSTER_FAULTS = (
    "munge_kill",
    "leader_kill",
    "leader_stop",
    "postgres_restart",
    "slurmctld_restart",
)
JOB_FAULTS = ("rank_stop", "double_xid")
FAULTS = NODE_FAULTS + CLUSTER_FAULTS + JOB_FAULTS
HEAL_S = {
    "nic_down": 30.0,
    "disk_ro": 30.0,
    "disk_full": 30.0,
    "slurmd_kill": 30.0,
    "node_crash": 30.0,
    "agent_kill": 5.0,
    "munge_kill": 10.0,
    "leader_kill": 10.0,
    "postgres_restart": 5.0,
    "slurmctld_restart": 5.0,
    "rank_stop": 120.0,
}
FILLER = "chaos-filler"


@dataclass
class Injector:
    """Lands faults on ``cluster``; ``lease_s`` is the controllers' lease TTL."""

    cluster: LocalCluster
    rng: random.Random
    lease_s: float

    def inject(
        self,
        kind: str,
        in_service: Sequence[str],
        training: Sequence[tuple[int, tuple[str, ...]]],
        heal: Heal,
    ) -> list[Injection]:
        """Land one fault of ``kind``; the injections it made (none: no target)."""
        now = time.time()
        if kind in CLUSTER_FAULTS:
            return self._cluster_fault(kind, now, heal)
        if kind in JOB_FAULTS:
            if not training:
                return []
            job_id, nodes = self.rng.choice(sorted(training))
            return self._job_fault(kind, job_id, nodes, now, heal)
        if not in_service:
            return []
        node = self.rng.choice(sorted(in_service))
        self._node_fault(kind, node, now, heal)
        return [Injection(now, kind, node, now + HEAL_S[kind] if kind in HEAL_S else None)]

    # -- a node ----------------------------------------------------------------------------
    def _node_fault(self, kind: str, node: str, now: float, heal: Heal) -> None:
        c, s = self.cluster, self.cluster.services
        due = now + HEAL_S.get(kind, 0.0)
        if kind.startswith("xid"):
            drill.inject_xid(c, node, xid=int(kind[3:]))
        elif kind == "nic_down":
            s.set_link(node, False)
            heal.append((due, ok(s.set_link, node, True)))
        elif kind == "disk_ro":
            _remount(str(s.scratch(node)), "ro")
            heal.append((due, lambda: _remount(str(s.scratch(node)), "rw")))
        elif kind == "disk_full":
            _fill(str(s.scratch(node) / FILLER))
            heal.append((due, lambda: _unlink(str(s.scratch(node) / FILLER))))
        elif kind == "agent_kill":
            _kill(s.pid(f"agent-{node}"), signal.SIGKILL)
            heal.append((due, ok(s.start_agent, node)))
        elif kind == "slurmd_kill":
            c.node_kill(node)
            heal.append((due, lambda: reboot(c, node)))
        elif kind == "node_crash":
            c.node_crash(node)
            heal.append((due, lambda: reboot(c, node)))
        else:
            raise ValueError(f"unknown node fault {kind!r}")

    # -- the cluster's services ------------------------------------------------------------
    def _cluster_fault(self, kind: str, now: float, heal: Heal) -> list[Injection]:
        c, s = self.cluster, self.cluster.services
        due = now + HEAL_S.get(kind, 2 * self.lease_s)
        if kind in ("leader_kill", "leader_stop"):
            leaders = [n for n in s.controllers if ha.leader_gauge(s.url_of(n)) == 1.0]
            pid = s.pid(leaders[0]) if leaders else None
            if pid is None:
                return []
            name = leaders[0]
            if kind == "leader_kill":
                _kill(pid, signal.SIGKILL)
                heal.append((due, ok(s.start_controller, 30.0, None, name)))
            else:
                _kill(pid, signal.SIGSTOP)
                heal.append((due, ok(_kill, pid, signal.SIGCONT)))
            return [Injection(now, kind, name, due)]
        if kind == "munge_kill":
            _kill(c.owned_pids().get("munged"), signal.SIGKILL)
            heal.append((due, ok(c._start_munged)))  # noqa: SLF001
            return [Injection(now, kind, "munged", due)]
        if kind == "postgres_restart":
            ha.stop_database(c.shape, remove=False)
            heal.append((due, ok(ha.start_database, c.shape, False)))
            return [Injection(now, kind, "postgres", due)]
        if kind == "slurmctld_restart":
            procs.stop([p for n, p in c.owned_pids().items() if n == "slurmctld"])
            heal.append((due, ok(c._start_slurmctld)))  # noqa: SLF001
            return [Injection(now, kind, "slurmctld", due)]
        raise ValueError(f"unknown cluster fault {kind!r}")

    # -- a running training job ------------------------------------------------------------
    def _job_fault(
        self, kind: str, job_id: int, nodes: tuple[str, ...], now: float, heal: Heal
    ) -> list[Injection]:
        c = self.cluster
        if kind == "rank_stop":
            node = self.rng.choice(sorted(nodes))
            pids = drill.freeze_ranks(c, job_id, node)
            due = now + HEAL_S[kind]
            heal.append((due, ok(_continue, pids)))
            return [Injection(now, kind, node, due)]
        if kind == "double_xid":
            if len(nodes) < 2:
                return []
            first, second = self.rng.sample(sorted(nodes), 2)
            at = drill.inject_xid(c, first)
            then = drill.inject_xid(c, second)
            return [Injection(at, kind, first), Injection(then, kind, second)]
        raise ValueError(f"unknown job fault {kind!r}")


def reboot(cluster: LocalCluster, node: str) -> bool:
    """The machine comes back. False while a reboot the controller started holds the
    node: the driver tries again shortly, until the node's slurmd runs."""
    try:
        cluster.node_reboot(node)
    except Exception as exc:  # noqa: BLE001 - a reboot the controller started meanwhile
        print(f"  heal {node}: {exc}", flush=True)
    return cluster.slurmd_pid(node) is not None


def ok(fn: Callable[..., object], *args: object) -> Callable[[], bool]:
    """A heal that is done once ``fn(*args)`` returned."""

    def heal() -> bool:
        fn(*args)
        return True

    return heal


def _continue(pids: Sequence[int]) -> None:
    for pid in pids:
        _kill(pid, signal.SIGCONT)


def _kill(pid: int | None, sig: int) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _remount(path: str, mode: str) -> bool:
    """Remount ``path`` ``mode``; True once it is (a reboot may have done it already)."""
    res = subprocess.run(
        ["mount", "-o", f"remount,{mode}", path], capture_output=True, text=True, timeout=10
    )
    return res.returncode == 0


def _fill(path: str) -> None:
    """Write zeros until the filesystem is full (bounded by its size: 16 MiB here)."""
    chunk = b"\0" * (1 << 20)
    try:
        with open(path, "wb", buffering=0) as f:
            for _ in range(1024):  # bounded whatever the mount's size
                if not f.write(chunk):
                    break
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EROFS):
            raise


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False  # read-only meanwhile: try again later
    return True
