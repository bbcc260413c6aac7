"""Fault drills on the local cluster with the hyperpod services running.

``Drill`` injects faults the way the hardware would show them to the node's agent (a
fake GPU scenario edit, a link set down in the node's network namespace, a scratch
mount remounted read-only), reads Slurm through the project's ``SlurmClient`` and the
controller through the real admin CLI (``hyperpod … --json``, MUNGE identity), and
puts the cluster back the way every test expects it: healthy scenarios, links up,
scratch read-write, every in-service node idle with no reason, the spare drained with
``hyperpod:spare``, no incident. Every wait is bounded.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from hyperpod_agent.controller.config import load_config
from hyperpod_agent.errors import LocalClusterError, SlurmError
from hyperpod_agent.localcluster import reset
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.localcluster.services import HEALTHY_GPUS, Services
from hyperpod_agent.slurm.models import Node

CMD_TIMEOUT = 20.0
FILLER = "drill-filler"  # the file fill_scratch writes on a node's scratch mount
SPARE_REASON = "hyperpod:spare"
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"})


def wait_for(
    what: str,
    check: Callable[[], bool],
    timeout: float = 30.0,
    step: float = 0.2,
    detail: Callable[[], object] | None = None,
) -> float:
    """Poll ``check`` until it holds; the seconds it took. Fails naming ``what``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(step)
    extra = f": {detail()}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{extra}")


def _write_atomic(path: Path, text: str) -> None:
    # The agent re-reads the scenario when it changes: never let it see half a file.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Drill:
    """Fault injection, observation and restore for one service cluster."""

    def __init__(self, cluster: LocalCluster) -> None:
        from hyperpod_agent.slurm.client import SlurmClient

        self.cluster = cluster
        self.services: Services = cluster.services
        self.slurm = SlurmClient(cluster.slurm_conf, timeout=10)
        self.env = {**cluster.env, "HYPERPOD_LOCAL_CLUSTER_DIR": str(cluster.dir)}
        self.env.pop("HYPERPOD_ADMIN_CONFIG", None)
        self.env.pop("HYPERPOD_CONTROLLER_URL", None)

    @property
    def nodes(self) -> list[str]:
        return list(self.cluster.nodes)

    @property
    def spares(self) -> list[str]:
        return list(self.cluster.spares)

    @property
    def all_nodes(self) -> list[str]:
        return self.nodes + self.spares

    # ------------------------------------------------------------------ reading
    def node(self, name: str) -> Node:
        return self.slurm.node(name)

    def states(self) -> dict[str, Node]:
        return {n.name: n for n in self.slurm.list_nodes()}

    def hyperpod(
        self, *args: str, timeout: float = CMD_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """The real admin CLI, as root (a MUNGE admin identity)."""
        return subprocess.run(
            [sys.executable, "-m", "hyperpod_agent", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            check=False,
        )

    def hyperpod_json(self, *args: str) -> Any:
        res = self.hyperpod(*args, "--json")
        if res.returncode != 0:
            raise AssertionError(
                f"hyperpod {' '.join(args)} --json: rc {res.returncode}: {res.stderr.strip()}"
            )
        return json.loads(res.stdout)

    def events(self, node: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        args = ["events", "--limit", str(limit)]
        if node is not None:
            args += ["--node", node]
        events: list[dict[str, Any]] = self.hyperpod_json(*args)
        return events

    def last_event_id(self) -> int:
        events = self.events(limit=1)
        return max((int(e["id"]) for e in events), default=0)

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.hyperpod_json("status")
        return status

    def controller_nodes(self) -> dict[str, dict[str, Any]]:
        return {n["name"]: n for n in self.hyperpod_json("nodes")}

    # ------------------------------------------------------------------ faults
    def inject_xid(self, node: str, xid: int, gpu: int = 3, message: str = "") -> None:
        """Append one XID event to ``node``'s GPU scenario (delivered once, by id)."""
        path = self.services.scenario(node)
        scenario = json.loads(path.read_text())
        events = list(scenario.get("xid_events", []))
        event: dict[str, Any] = {"gpu": gpu, "xid": xid, "id": f"drill-{time.time_ns()}"}
        if message:
            event["message"] = message
        events.append(event)
        scenario["xid_events"] = events
        _write_atomic(path, json.dumps(scenario) + "\n")

    def heal_gpus(self, node: str) -> None:
        _write_atomic(self.services.scenario(node), json.dumps(HEALTHY_GPUS) + "\n")

    def set_link(self, node: str, up: bool) -> None:
        self.services.set_link(node, up)

    def remount_scratch(self, node: str, read_only: bool) -> None:
        subprocess.run(
            [
                "mount",
                "-o",
                "remount," + ("ro" if read_only else "rw"),
                str(self.services.scratch(node)),
            ],
            check=True,
            capture_output=True,
            timeout=CMD_TIMEOUT,
        )

    def fill_scratch(self, node: str) -> None:
        """Fill ``node``'s scratch mount to the last block, as a user's job would."""
        chunk = b"\0" * (1 << 20)
        with open(self.services.scratch(node) / FILLER, "wb", buffering=0) as f:
            try:
                while f.write(chunk):
                    pass
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise

    def empty_scratch(self, node: str) -> None:
        (self.services.scratch(node) / FILLER).unlink(missing_ok=True)

    def scratch_read_only(self, node: str) -> bool:
        target = str(self.services.scratch(node))
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if fields[1] == target:
                    return "ro" in fields[3].split(",")
        return False

    def lose_node(self, node: str) -> None:
        """The node goes silent: its agent and its slurmd killed (SIGKILL), so neither a
        heartbeat nor slurmd's registration reaches anyone. ``restore`` boots it again."""
        pid = self.services.pid(f"agent-{node}")
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        self.cluster.node_kill(node)

    def restart_agent(self, node: str) -> None:
        """What a GPU reset does to the node's agent: it starts afresh, so faults it
        keeps until restart (RESET-class XIDs) are forgotten."""
        self.services.stop(f"agent-{node}")
        self.services.start_agent(node)

    # ------------------------------------------------------------------ controller
    def fresh_controller(
        self,
        timeout: float = 30.0,
        policy: dict[str, Any] | None = None,
        deep_checks: dict[str, Any] | None = None,
        provider: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """Restart the controller on empty state, and every agent with it.

        Drills are first faults: fault history left by an earlier run would escalate
        (RESET -> REBOOT -> REPLACE) or hold a node as a lemon. The agents restart too,
        so each sends a full report to the new controller at once. ``policy`` overrides
        the local cluster's policy settings until the next fresh controller, and
        ``deep_checks`` its deep-check settings (the gates); ``provider`` replaces its
        ``[provider]`` section and ``env`` adds to the controller's environment (a
        pause point, controller/crash.py).
        """
        reset.fresh_controller(self.cluster, policy, deep_checks, provider, env)
        wait_for(
            "every agent reporting to the new controller",
            lambda: (
                all(
                    n.get("verdict") not in (None, "unknown")
                    for n in self.controller_nodes().values()
                )
                and len(self.controller_nodes()) == len(self.all_nodes)
            ),
            timeout=timeout,
            step=0.5,
            detail=self.controller_nodes,
        )

    def scontrol_as_root(self, *args: str) -> None:
        """``scontrol update ...`` as root, the way an admin types it: not through the
        controller nor the project's Slurm client."""
        subprocess.run(
            ["scontrol", "update", *args],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT,
        )

    def human_drain(self, node: str, reason: str) -> None:
        """An admin drains ``node`` with their own reason (never ``hyperpod:...``)."""
        assert not reason.startswith("hyperpod:"), reason
        self.scontrol_as_root(f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def human_resume(self, node: str) -> None:
        self.scontrol_as_root(f"NodeName={node}", "State=RESUME")

    # ------------------------------------------------------------------ restore
    def _in_service_ok(self, node: Node) -> bool:
        return (
            node.state == "IDLE"
            and "DRAIN" not in node.flags
            and not node.flags & REBOOT_FLAGS
            and node.responding
            and not node.reason
        )

    def _spare_ok(self, node: Node) -> bool:
        return node.reason.strip() == SPARE_REASON and "DRAIN" in node.flags and node.responding

    def settled(self) -> bool:
        """The state every drill starts from."""
        nodes = self.states()
        return all(self._in_service_ok(nodes[n]) for n in self.nodes) and all(
            self._spare_ok(nodes[n]) for n in self.spares
        )

    def describe(self) -> dict[str, str]:
        return {
            n.name: f"{n.state}+{'+'.join(sorted(n.flags))} reason={n.reason!r}"
            for n in self.states().values()
        }

    def describe_reboots(self) -> str:
        """Node states and the tail of the fake reboots' log (RebootProgram output)."""
        log = self.cluster.dir / "log" / "reboot.log"
        try:
            tail = " | ".join(log.read_text().strip().splitlines()[-4:])
        except OSError:
            tail = "(no reboot log)"
        return f"{self.describe()}; reboot.log: {tail}"

    def _controller_healthy(self, names: Iterable[str]) -> bool:
        view = self.controller_nodes()
        return all(
            view.get(n, {}).get("verdict") == "healthy" and view.get(n, {}).get("open_faults") == 0
            for n in names
        )

    def restore(self, restart_agents: Iterable[str] = (), timeout: float = 60.0) -> None:
        """Put the cluster back: hardware healthy, the controller seeing every node
        healthy, in-service nodes idle without reason, the spare back in the pool,
        no incident. ``restart_agents`` names nodes whose agent holds a fault until it
        restarts (RESET-class XIDs)."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        # Drills are about nodes: a job an earlier test left in view (an auto-resume
        # job Slurm still shows as FAILED) would turn a reboot into a replacement. The
        # controller's deep-check jobs are its runs' (cancelled, they hold their nodes).
        for job in self.slurm.list_jobs(all_states=False):
            if not reset.check_job(job):
                self.slurm.cancel(job.job_id)
        # ... and a FAILED auto-resume job still in view would be requeued by a fault
        # the next drill injects on its node.
        reset.retire_finished_jobs(self.cluster)
        for name in self.all_nodes:
            self.heal_gpus(name)
            self.set_link(name, True)
            if self.scratch_read_only(name):
                self.remount_scratch(name, read_only=False)
            self.empty_scratch(name)
        for name in self.all_nodes:
            if self.cluster.slurmd_pid(name) is None:
                # slurmd gone (killed, or a reboot that never ran): a fresh boot
                # brings it back and restarts the node's agent. A reboot under way
                # (its slurmd stopped, the new one not yet started) finishes alone.
                try:
                    self.cluster.node_reboot(name)
                except LocalClusterError as exc:
                    if "already under way" not in str(exc):
                        raise
        for name in restart_agents:
            self.restart_agent(name)
        # Reboots in flight finish on their own (RebootProgram -> new boot time).
        wait_for(
            "reboots in flight to finish",
            lambda: not any(n.flags & REBOOT_FLAGS for n in self.states().values()),
            timeout=left(),
            detail=self.describe,
        )
        # An agent still reporting a fault its hardware no longer shows holds it until
        # restart: restart it rather than wait forever.
        try:
            wait_for("agents healthy", lambda: self._controller_healthy(self.all_nodes), 4.0, 0.5)
        except AssertionError:
            view = self.controller_nodes()
            for name in self.all_nodes:
                if view.get(name, {}).get("verdict") != "healthy":
                    self.restart_agent(name)
        wait_for(
            "the controller to see every node healthy",
            lambda: self._controller_healthy(self.all_nodes),
            timeout=left(),
            step=0.5,
            detail=self.controller_nodes,
        )
        nodes = self.states()
        checking = reset.under_check(self.slurm)
        for name in self.spares:
            node = nodes[name]
            if name in checking:
                continue  # being qualified: its run puts it back in the pool
            if node.reason.strip() != SPARE_REASON or "DRAIN" not in node.flags:
                self.slurm.drain(name, SPARE_REASON)
        for name in self.nodes:
            node = nodes[name]
            if node.drained or node.reason:
                # Reasons the controller never resumes (hold, replace, a human's):
                # the drill made them, the drill takes them back.
                try:
                    self.slurm.resume(name)
                except SlurmError:
                    pass  # resumed by the controller meanwhile
        wait_for(
            "in-service nodes idle with no reason and the spare pooled",
            self.settled,
            timeout=left(),
            detail=self.describe,
        )
        wait_for(
            "no incident mode",
            lambda: not self.status()["incident_mode"],
            timeout=left(),
            step=0.5,
            detail=self.status,
        )
        if self.spare_gate_on():
            # The local cluster names a suite, so the spare gate is on by default: a
            # spare back in the pool is ready for a swap only once it passed again.
            wait_for(
                "the spares qualified",
                self.spares_qualified,
                timeout=max(left(), 90.0),
                step=1.0,
                detail=lambda: {"runs": self.hyperpod_json("checks"), **self.describe()},
            )

    def spare_gate_on(self) -> bool:
        """Whether the running controller's config has the spare gate on."""
        path = self.services.controller_config_path()
        return load_config(path).deep_checks.spare_gate_on

    def spares_qualified(self) -> bool:
        """Every pooled spare passed a run since it entered the pool, none under way."""
        if any(r["phase"] != "done" for r in self.hyperpod_json("checks")):
            return False
        for name in self.spares:
            node = self.node(name)
            if node.reason.strip() != SPARE_REASON:
                continue
            since = node.reason_time.timestamp() - 1.0 if node.reason_time else 0.0
            outcomes = self.hyperpod_json("node", "show", name).get("deep_checks", [])
            if not any(
                o["outcome"] == "OK" and o["at"] and _ts(o["at"]) >= since for o in outcomes
            ):
                return False
        return True


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def frozen(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state T in /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


# ---------------------------------------------------------------------------------------
# Shared by the drills that run a real fault during something else (the hostile-user
# drills, tests/integration/test_hostile_*.py): what test_fault_drills.py measures, the
# fixture every first-fault drill starts from, the reconcile loop's pass counter, and
# seeded random choices of the node a fault lands on.

DETECT_S = 20.0  # fault injected -> node taken out (measured ~1-3 s; bench/detect_drain.py)
REBOOT_S = 60.0  # reboot of an idle node -> in service (~2-5 s; ~37 s when Slurm misses the boot)
SEED_ENV = "HYPERPOD_DRILL_SEED"  # set it to the seed a drill printed to replay its choices
XID79_REASON = "hyperpod:reboot gpu3 xid79"  # what the controller drains an XID 79 node with
LOCAL_RECONCILE_S = 2.0  # the local cluster's reconcile_interval_s (localcluster/services.py)


def fresh_drill(cluster: LocalCluster) -> Iterator[Drill]:
    """A fixture's body: a controller on empty state (every fault a first fault), the
    cluster restored before and after. ``yield from fresh_drill(service_cluster)``."""
    drill = Drill(cluster)
    drill.fresh_controller()
    drill.restore()
    yield drill
    drill.restore()


def taken_out(node: Node) -> bool:
    """Out of service by the controller: drained or rebooting, with a reason we own."""
    return node.reason.startswith("hyperpod:") and (node.drained or bool(node.flags & REBOOT_FLAGS))


def back_in_service(node: Node) -> bool:
    return (
        node.state == "IDLE"
        and not node.drained
        and not node.flags & REBOOT_FLAGS
        and node.responding
        and not node.reason
    )


def new_events(drill: Drill, since: int, node: str | None = None) -> list[dict[str, Any]]:
    return [e for e in drill.events(node) if int(e["id"]) > since]


def metric(url: str, name: str, labels: str) -> float:
    """One sample of ``name{labels}`` from the /metrics page at ``url`` (0 when absent)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def samples(url: str, name: str) -> dict[str, float]:
    """Every sample of ``name`` on the /metrics page at ``url``, by its label text
    (``action="reboot"``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.findall(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", text, re.M)
    return {labels: float(value) for labels, value in found}


def passes(url: str) -> dict[str, float]:
    """``hyperpod_controller_passes_total`` by outcome (``ok``, ``error``...), from the
    controller's /metrics at ``url``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.findall(r'^hyperpod_controller_passes_total\{outcome="(\w+)"\} (\S+)$', text, re.M)
    return {outcome: float(value) for outcome, value in found}


def kept_passing(url: str, before: dict[str, float], since: float) -> dict[str, float]:
    """Asserts that the reconcile loop kept passing since the monotonic time ``since``,
    when ``before`` (``passes(url)``) was read: at least one good pass per two reconcile
    intervals (half the local cluster's rate of one per 2 s, for a loaded machine), at
    least two, and none ended in error. Returns the counts now."""
    now = passes(url)
    took = time.monotonic() - since
    wanted = max(2, int(took / (2 * LOCAL_RECONCILE_S)))
    ran = now.get("ok", 0) - before.get("ok", 0)
    assert ran >= wanted, f"{ran:g} good passes in {took:.0f} s, wanted {wanted}: {before} {now}"
    assert now.get("error", 0) == before.get("error", 0), f"passes ended in error: {before} {now}"
    return now


class Dice:
    """Seeded random choices for one drill, each said on stdout with the seed (pytest
    shows a failed test's output), so a failure replays: ``HYPERPOD_DRILL_SEED=<seed>``."""

    def __init__(self, drill_name: str) -> None:
        given = os.environ.get(SEED_ENV, "").strip()
        self.seed = int(given) if given else secrets.randbits(32)
        self._rng = random.Random(self.seed)
        print(f"{drill_name}: seed {self.seed} (replay with {SEED_ENV}={self.seed})")

    def node(self, role: str, eligible: Iterable[str]) -> str:
        """One node of ``eligible`` for ``role`` (sorted first: the same seed, the same
        node, whatever order the caller had them in)."""
        pool = sorted(eligible)
        if not pool:
            raise AssertionError(f"no node can be the {role}")
        chosen = self._rng.choice(pool)
        print(f"  {role}: {chosen} (of {', '.join(pool)}; seed {self.seed})")
        return chosen

    def nodes(self, role: str, eligible: Iterable[str], k: int) -> list[str]:
        """``k`` distinct nodes of ``eligible`` for ``role``, in the order drawn."""
        pool = sorted(eligible)
        if len(pool) < k:
            raise AssertionError(f"{k} nodes wanted for the {role}, only {pool} can be")
        chosen = self._rng.sample(pool, k)
        print(f"  {role}: {', '.join(chosen)} (of {', '.join(pool)}; seed {self.seed})")
        return chosen


class RealFault:
    """A real XID 79 (GPU fallen off the bus) on one node, and what handling it as on any
    day means (test_fault_drills.py): the node taken out for a reboot under our reason
    within DETECT_S of the injection, a fault and a reboot event for it, and once the node
    is idle a reboot (a new slurmd) that puts it back in service within REBOOT_S.

    A thread watches the node from the injection on, so the time it took to take the
    node out is measured even while the drill's own thread is busy with an attack."""

    WATCH_S = 300.0  # the watcher's own bound: longer than any drill waits for it

    def __init__(self, drill: Drill, node: str) -> None:
        self.drill = drill
        self.node = node
        self.since = 0
        self.pid: int | None = None
        self.injected = 0.0
        self.out_after: float | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def inject(self) -> None:
        self.since = self.drill.last_event_id()
        self.pid = self.drill.cluster.slurmd_pid(self.node)
        self.drill.inject_xid(self.node, 79, gpu=3, message="GPU has fallen off the bus")
        self.injected = time.monotonic()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _out(self) -> bool:
        node = self.drill.node(self.node)
        return taken_out(node) and node.reason.startswith(XID79_REASON)

    def _watch(self) -> None:
        while not self._stop.wait(0.1) and time.monotonic() - self.injected < self.WATCH_S:
            try:
                if self._out():
                    self.out_after = time.monotonic() - self.injected
                    return
            except Exception:  # noqa: BLE001 - a slow scontrol: the next look counts
                continue

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(5)

    def taken_out(self, timeout: float = DETECT_S) -> float:
        """Seconds from the injection to the node seen out for its reboot under our
        reason; fails once ``timeout`` has passed since the injection without it."""
        wait_for(
            f"{self.node} taken out for its XID 79",
            lambda: self.out_after is not None,
            timeout=max(0.1, timeout - (time.monotonic() - self.injected)),
            step=0.1,
            detail=self.drill.describe,
        )
        assert self.out_after is not None
        return self.out_after

    def events(self) -> list[dict[str, Any]]:
        """The node's events since the injection, which must hold the fault and the
        reboot asked for it."""
        events = new_events(self.drill, self.since, self.node)
        assert any(e["kind"] == "fault" and "xid79" in e["cause"] for e in events), events
        assert any(e["kind"] == "reboot" and "xid79" in e["cause"] for e in events), events
        return events

    def back(self, timeout: float = REBOOT_S) -> float:
        """Waits until the node was rebooted (a new slurmd) and is back in service; the
        seconds that took from the call (the node must be idle by then: a reboot asked
        with ASAP waits for the node's jobs)."""
        return wait_for(
            f"{self.node} rebooted and back in service",
            lambda: (
                back_in_service(self.drill.node(self.node))
                and self.drill.cluster.slurmd_pid(self.node) not in (None, self.pid)
            ),
            timeout,
            detail=self.drill.describe_reboots,
        )
