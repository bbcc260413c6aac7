"""A real multi-node Slurm cluster on one machine.

One munged (own key and socket), one slurmctld and one slurmd per node, each slurmd
in its own UTS namespace whose hostname is the node name, all on 127.0.0.1 with a
port per node. Everything lives under one directory; the machine's /etc/slurm and
/etc/munge are never read or written. See docs/local-cluster.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path

from hyperpod_agent.errors import LocalClusterError
from hyperpod_agent.localcluster import (
    daemons,
    files,
    namespaces,
    procs,
    provisioned,
    teardown,
)
from hyperpod_agent.localcluster.services import Services
from hyperpod_agent.localcluster.shape import Shape

log = logging.getLogger(__name__)

DEFAULT_DIR = Path("/var/tmp/hyperpod-local")
DEFAULT_PORT_BASE = 16817
SBIN = daemons.SBIN
GOING_DOWN = "going-down"  # in run/: written by down, removed by up


class LocalCluster:
    """Start, inspect and stop the local cluster living in ``dir``."""

    def __init__(
        self,
        dir: Path = DEFAULT_DIR,
        nodes: int = 4,
        spares: int = 1,
        port_base: int = DEFAULT_PORT_BASE,
        ha: bool = False,
        shipped_cadences: bool = False,
        site_hooks: bool = False,
        bare: bool = False,
        **timing: int,
    ) -> None:
        self.shape = Shape(
            Path(dir).resolve(),
            nodes,
            spares,
            port_base,
            ha=ha,
            shipped_cadences=shipped_cadences,
            site_hooks=site_hooks,
            bare=bare,
            **timing,
        )

    # ----------------------------------------------------------------- layout
    @property
    def dir(self) -> Path:
        return self.shape.dir

    @property
    def slurm_conf(self) -> Path:
        return self.shape.slurm_conf

    @property
    def munge_socket(self) -> Path:
        return self.shape.munge_socket

    @property
    def nodes(self) -> list[str]:
        return self.shape.node_names

    @property
    def spares(self) -> list[str]:
        return self.shape.spare_names

    @property
    def env(self) -> dict[str, str]:
        return daemons.cluster_env(self.shape)

    def _run(self, name: str) -> Path:
        return self.dir / "run" / name

    @classmethod
    def load(cls, dir: Path) -> LocalCluster:
        """The cluster described by ``dir/cluster.json`` (written by ``up``)."""
        meta = Path(dir).resolve() / "cluster.json"
        try:
            data = json.loads(meta.read_text())
            data.pop("dir")
            data.pop("host_boot_epoch", None)
            return cls(Path(dir), **data)
        except FileNotFoundError:
            raise LocalClusterError(f"no local cluster in {dir} ({meta} is missing)") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise LocalClusterError(f"{meta} is unreadable: {exc}") from None

    # ----------------------------------------------------------------- checks
    def check_can_start(self) -> None:
        """Everything that must hold before anything is started."""
        daemons.preflight(self.shape)

    def check_ports(self) -> None:
        """Every port the cluster needs is free on 127.0.0.1."""
        daemons.ports_free(self.shape.ports)

    # ------------------------------------------------------------------ up
    def running(self) -> bool:
        return procs.read_pidfile(self._run("slurmctld.pid"), "slurmctld") is not None

    @property
    def services(self) -> Services:
        """The controller and agents of this cluster (see services.py)."""
        return Services(self.shape)

    def has_services(self) -> bool:
        return self.services.controller_config_path().exists()

    def up(self, timeout: float = 60.0, services: bool = False) -> bool:
        """Start the cluster (and, with ``services``, a controller and an agent per
        node); False if the same cluster already runs here."""
        if self.running():
            current = LocalCluster.load(self.dir).shape
            if current != self.shape:
                raise LocalClusterError(
                    f"a different local cluster runs in {self.dir} "
                    f"({current.nodes} nodes + {current.spares} spares); run down first"
                )
            with contextlib.suppress(PermissionError):  # a non-root caller only looks
                self._run(GOING_DOWN).unlink(missing_ok=True)  # an earlier down is over
            self.wait_idle(self.nodes, timeout)
            if services and not self.has_services():
                self.services.up()
            return False
        self.check_can_start()
        self._run(GOING_DOWN).unlink(missing_ok=True)  # an earlier down is over
        self.stop_daemons()  # stale pids after a crash: clean whatever is left
        self.check_ports()
        files.write_files(self.shape)
        try:
            if services:
                self.services.provision()
            elif not self.shape.bare:
                # Slurm only: the head node's lifecycle script, the plain parameters.
                data = provisioned.parameters_data(self.shape, step_retry=False)
                provisioned.provision(self.shape, data, [provisioned.HEAD])
            namespaces.pin_host(self.dir / "run")
            self._start_munged()
            self._start_slurmctld()
            daemons.drain_spares(self.slurm_conf, self.spares, timeout)
            for name in self.shape.all_names:
                self.node_start(name)
            self.wait_idle(self.nodes, timeout)
            if services:
                self.services.start()
        except BaseException:
            self.down()
            raise
        return True

    def _start_munged(self) -> None:
        pid = daemons.start_munged(
            self.dir / "munge", self.munge_socket, self.dir / "log" / "munged.log"
        )
        procs.write_pidfile(self._run("munged.pid"), pid)

    def _start_slurmctld(self) -> None:
        pid = daemons.start_process(
            self.shape,
            [str(SBIN / "slurmctld"), "-D", "-i", "-f", str(self.slurm_conf)],
            "slurmctld.stdout",
        )
        procs.write_pidfile(self._run("slurmctld.pid"), pid)

    # ---------------------------------------------------------------- nodes
    def slurmd_pid(self, name: str) -> int | None:
        return procs.read_pidfile(self._run(f"slurmd-{name}.pid"), "slurmd")

    def node_start(self, name: str) -> int:
        """Start ``name``'s slurmd unless it runs; returns its pid. Waits for a fake
        reboot under way to finish first (a start in its middle would spoil it)."""
        self._check_node(name)
        with open(self._run(f"reboot-{name}.lock"), "w") as lock:
            if not teardown.lock_within(lock, time.monotonic() + 30):
                raise LocalClusterError(f"{name}: a reboot did not finish")
            self._refuse_if_going_down(name)
            return self._start_slurmd(name, fresh_boot=False)

    def _refuse_if_going_down(self, name: str) -> None:
        """Under the node's reboot lock: a cluster being stopped starts no slurmd (a
        reboot slurmctld asked for just before ``down`` would outlive it)."""
        if self._run(GOING_DOWN).exists():
            raise LocalClusterError(f"{name}: not started, the cluster is being stopped")

    def _start_slurmd(self, name: str, fresh_boot: bool) -> int:
        """Start ``name``'s slurmd in a new UTS namespace (and, for a fake reboot,
        a new time namespace whose boot time is now). Returns its pid."""
        pid = self.slurmd_pid(name)
        if pid is not None:
            return pid
        (self.dir / "spool" / name).mkdir(parents=True, exist_ok=True)
        argv = ["unshare", "--uts"]
        if fresh_boot:
            meta = json.loads((self.dir / "cluster.json").read_text())
            # The new namespace's uptime starts in [0, 1) s: slurmd reports a boot
            # time of "now", after the reboot request, as a real reboot would.
            offset = int(time.time() - meta["host_boot_epoch"])
            argv += ["--time", "--boottime", str(-offset)]
        # sh sets the hostname, then becomes slurmd: one pid from unshare to slurmd.
        argv += [
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            name,
            str(SBIN / "slurmd"),
            "-D",
            "-f",
            str(self.slurm_conf),
        ]
        pid = daemons.start_process(self.shape, argv, f"slurmd-{name}.stdout")
        ns = procs.wait_for_new_uts_ns(pid)
        if ns is None:
            raise LocalClusterError(
                f"{name}: slurmd did not start "
                f"({daemons.log_tail(self.dir / 'log' / f'slurmd-{name}.stdout')})"
            )
        namespaces.pin_node(self.dir / "run", name, pid)
        deadline = time.monotonic() + 5
        while not os.path.basename(procs.exe(pid)).startswith("slurmd"):
            if time.monotonic() > deadline or not procs.alive(pid):
                raise LocalClusterError(
                    f"{name}: slurmd did not start "
                    f"({daemons.log_tail(self.dir / 'log' / f'slurmd-{name}.log')})"
                )
            time.sleep(0.01)
        procs.write_pidfile(self._run(f"slurmd-{name}.pid"), pid)
        return pid

    def node_kill(self, name: str, sig: str = "KILL") -> int:
        """Send ``sig`` to ``name``'s slurmd (a node failure); returns the pid."""
        self._check_node(name)
        pid = self.slurmd_pid(name)
        if pid is None:
            raise LocalClusterError(f"{name}: slurmd is not running")
        os.kill(pid, getattr(signal, f"SIG{sig.upper().removeprefix('SIG')}"))
        return pid

    def node_crash(self, name: str) -> list[int]:
        """The whole node dies at once: SIGKILL to its slurmd and to everything in
        its namespace (slurmstepd, job tasks), as when a machine loses power."""
        pid = self.slurmd_pid(name)
        if pid is None:
            raise LocalClusterError(f"{name}: slurmd is not running")
        ns = procs.uts_ns(pid)
        host = procs.uts_ns(os.getpid())
        victims = procs.pids_in_namespaces({ns}) if ns and ns != host else [pid]
        for p in victims:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return victims

    def node_reboot(self, name: str) -> int:
        """A fake reboot: stop the slurmd and start it with a fresh boot time, so
        slurmctld sees the node come back as rebooted. A reboot already under way
        for the node makes this one a no-op (slurmctld may run RebootProgram twice)."""
        self._check_node(name)
        with open(self._run(f"reboot-{name}.lock"), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LocalClusterError(f"{name}: a reboot is already under way") from None
            self._refuse_if_going_down(name)
            pid = self.slurmd_pid(name)
            if pid is not None:
                procs.stop([pid])
            # The machine's hyperpod side comes back clean before Slurm sees it.
            if self.has_services():
                self.services.power_off(name)
            # slurmctld accepts the reboot as done only if the boot time it is told
            # is later than the second it issued the request in; slurmd's boot time
            # can read up to 2 s early (whole-second uptime).
            time.sleep(2.0)
            pid = self._start_slurmd(name, fresh_boot=True)
            if self.has_services():
                self.services.start_agent(name)
            return pid

    def _check_node(self, name: str) -> None:
        if name not in self.shape.all_names:
            raise LocalClusterError(
                f"no node {name!r} in this cluster (nodes: {','.join(self.shape.all_names)})"
            )

    def node_states(self) -> dict[str, str]:
        from hyperpod_agent.slurm.client import SlurmClient

        nodes = SlurmClient(slurm_conf=self.slurm_conf, timeout=10).list_nodes()
        return {n.name: "+".join([n.state, *sorted(n.flags)]) for n in nodes}

    def wait_idle(self, names: list[str], timeout: float = 30.0) -> None:
        """Wait until every node in ``names`` is IDLE and not drained."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            if procs.read_pidfile(self._run("slurmctld.pid"), "slurmctld") is None:
                raise LocalClusterError(
                    f"slurmctld exited: {daemons.log_tail(self.dir / 'log' / 'slurmctld.log')}"
                )
            try:
                states = self.node_states()
            except Exception as exc:  # slurmctld still starting: keep waiting
                states = {"?": str(exc)}
            if all(
                states.get(n, "").split("+")[0] == "IDLE" and "DRAIN" not in states.get(n, "")
                for n in names
            ):
                return
            time.sleep(0.2)
        bad = [n for n in names if states.get(n, "?").split("+")[0] != "IDLE"] or names
        seen = states.get(bad[0]) or states.get("?", "unknown")
        raise LocalClusterError(
            f"timed out after {timeout:g} s waiting for {','.join(bad)} to be idle "
            f"(state {seen}); see "
            f"{self.dir / 'log' / f'slurmd-{bad[0]}.log'}: "
            f"{daemons.log_tail(self.dir / 'log' / f'slurmd-{bad[0]}.log', 2)}"
        )

    # ---------------------------------------------------------------- down
    def owned_pids(self) -> dict[str, int]:
        """Every daemon of this cluster that is still alive, by name."""
        return teardown.owned_pids(self.dir / "run")

    def namespace_pids(self) -> list[int]:
        """Processes living in the namespaces our slurmd were started in."""
        return namespaces.node_pids(self.dir / "run")

    def stop_daemons(self) -> None:
        teardown.stop_daemons(self.dir / "run")

    def down(self) -> list[str]:
        """Cancel jobs, then stop every process of the cluster; what is still there
        afterwards (a process naming the directory, a mount, a network namespace),
        one line each: nothing, when all went well."""
        run = self.dir / "run"
        if run.is_dir():
            self._run(GOING_DOWN).touch()
        with contextlib.ExitStack() as held:
            teardown.hold_reboots(held, run, self.shape.all_names)
            self._stop_all()
        return teardown.settled_leftovers(self.dir, f"hp{self.shape.port_base}-")

    def _stop_all(self) -> None:
        if self.running():
            from hyperpod_agent.errors import SlurmError
            from hyperpod_agent.slurm.client import SlurmClient

            slurm = SlurmClient(slurm_conf=self.slurm_conf, timeout=5)
            try:
                for job in slurm.list_jobs():
                    if job.state in ("PENDING", "RUNNING", "SUSPENDED", "REQUEUED"):
                        slurm.cancel(job.job_id)
            except SlurmError as exc:  # the daemons are stopped next anyway
                log.warning("could not cancel jobs while stopping the cluster: %s", exc)
        if self.has_services():
            self.services.down()
            self.services.controller_config_path().unlink()
        self.stop_daemons()
        # The nodes' memory tiers are RAM (/dev/shm): give it back.
        shutil.rmtree(self.shape.memory_root, ignore_errors=True)
        shutil.rmtree(self.shape.progress_root, ignore_errors=True)
