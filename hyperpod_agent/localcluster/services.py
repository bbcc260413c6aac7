"""The hyperpod services of the local cluster: a controller and one agent per node.

Each node also gets the pieces real fault drills need: a fake GPU scenario file
(8 healthy GPUs) and its hardware (hardware.py: a scratch mount, a network namespace
with a data link the node's agent sees through its own sysfs).
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from hyperpod_agent.errors import LocalClusterError
from hyperpod_agent.localcluster import daemons, deepchecks, ha, hardware, procs, provisioned
from hyperpod_agent.localcluster.namespaces import is_mount
from hyperpod_agent.localcluster.shape import Shape
from hyperpod_agent.provision.models import ProvisioningParameters
from hyperpod_agent.provision.render import deep_merge
from hyperpod_agent.provision.render import to_toml as render_toml

log = logging.getLogger(__name__)

HEALTHY_GPUS = {"generate": 8}


def to_toml(data: dict[str, Any]) -> str:
    """A config as TOML, rendered as provisioning renders it, without provisioning's
    header: the harness or a drill wrote it."""
    return render_toml(data, header="")


# The keys that make the drills' cluster quick; with ``shipped_cadences`` they are left
# out, so agents and controllers run at the shipped defaults an admin gets.
AGENT_CADENCES = (
    ("cycle_s",),
    ("verdict", "grace_s"),
    ("probes", "gpu", "interval_s"),
    ("probes", "nic", "interval_s"),
    ("probes", "disk", "interval_s"),
    ("probes", "cpu", "interval_s"),
    ("probes", "slurmd", "interval_s"),
    ("controller", "heartbeat_interval_s"),
    ("controller", "backoff_max_s"),
)
CONTROLLER_CADENCES = (
    ("reconcile_interval_s",),
    ("policy", "heartbeat_timeout_s"),
    ("policy", "shared_cause_window_s"),
)


def _ship_cadences(config: dict[str, Any], keys: tuple[tuple[str, ...], ...]) -> None:
    for path in keys:
        section = config
        for part in path[:-1]:
            section = section.get(part, {})
        section.pop(path[-1], None)


def _relink(link: Path, target: Path) -> None:
    if not target.is_file():
        raise LocalClusterError(f"{target}: provisioning wrote no such file")
    link.unlink(missing_ok=True)
    link.symlink_to(target)


class Services:
    """Start and stop the controller and the agents of the cluster ``shape`` describes."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.dir = shape.dir

    @property
    def controller_port(self) -> int:
        return ha.controller_port(self.shape, "controller")

    @property
    def controller_url(self) -> str:
        return self.url_of("controller")

    @property
    def controllers(self) -> tuple[str, ...]:
        """The controllers' service names: two with ``--ha``, the first leading at start."""
        return ha.CONTROLLERS if self.shape.ha else ha.CONTROLLERS[:1]

    def url_of(self, controller: str) -> str:
        return f"http://127.0.0.1:{ha.controller_port(self.shape, controller)}"

    def _controller_keys(self) -> dict[str, Any]:
        """How clients (agents, the admin CLI) name the controllers."""
        if self.shape.ha:
            return {"urls": [self.url_of(c) for c in self.controllers]}
        return {"url": self.controller_url}

    def netns(self, node: str) -> str:
        return f"hp{self.shape.port_base}-{node}"

    def scratch(self, node: str) -> Path:
        return self.dir / "mnt" / node

    def scenario(self, node: str) -> Path:
        return self.dir / "gpu" / f"{node}.json"

    def cache(self, node: str) -> Path:
        return self.dir / "run" / f"agent-{node}" / "health.json"

    def metrics_port(self, node: str) -> int:
        return self.shape.port_base + 40 + int(node.removeprefix("node"))

    # ------------------------------------------------------------------ configs
    def auth(self) -> dict[str, Any]:
        # Every node shares 127.0.0.1 here, so the origin-address check cannot tell
        # nodes apart; MUNGE still proves uid and rejects replays.
        return {
            "mode": "munge",
            "munge_socket": str(self.shape.munge_socket),
            "check_origin": False,
        }

    @functools.cached_property
    def _parameters(self) -> ProvisioningParameters:
        return provisioned.parse(self.parameters_data())

    def parameters(self) -> ProvisioningParameters:
        """The cluster's provisioning_parameters.json: what every agent.toml and
        controller.toml here is rendered from, by provisioning's own code. Parsed (and
        every override validated) once per Services, not once per node."""
        return self._parameters

    def parameters_data(self) -> dict[str, Any]:
        data = provisioned.parameters_data(self.shape, step_retry=True)
        data.pop("controller_url")
        keys = self._controller_keys()
        if self.shape.ha:
            data["controller"] = {"nodes": list(self.controllers)}
            data["controller_urls"] = keys["urls"]
            # The password file's path on a controller node (relocated into DIR).
            pw = "/" + str(ha.password_file(self.shape).relative_to(self.dir))
            data["controller_store"] = {"url": ha.database_url(self.shape), "password_file": pw}
        else:
            data["controller"] = {"nodes": ["controller"]}
            data["controller_url"] = keys["url"]
        data["agent_overrides"] = deep_merge(data["agent_overrides"], self._agent_common())
        data["node_overrides"] = {n: self._agent_node(n) for n in self.shape.all_names}
        data["controller_overrides"] = self._controller_common()
        if self.shape.shipped_cadences:
            _ship_cadences(data["agent_overrides"], AGENT_CADENCES)
            _ship_cadences(data["controller_overrides"], CONTROLLER_CADENCES)
        return data

    def controller_config_path(self, controller: str = "controller") -> Path:
        """Where the drills find (and edit) controller ``controller``'s config: a link to
        the file its lifecycle script wrote."""
        return self.dir / "etc" / f"{controller}.toml"

    def agent_config_path(self, node: str) -> Path:
        """Where the drills find (and edit) ``node``'s agent config: a link to the file
        the node's lifecycle script wrote."""
        return self.dir / "etc" / f"agent-{node}.toml"

    def controller_config(self, controller: str = "controller") -> dict[str, Any]:
        """What provisioning writes for head ``controller`` (rendered afresh)."""
        return provisioned.controller_config(self.parameters(), self.shape, controller)

    def _controller_common(self) -> dict[str, Any]:
        return {
            "slurm_user": "root",  # SlurmUser in the local cluster's slurm.conf
            # Every head reads the one slurm.conf the daemons read (the second head's
            # own copy names its own include).
            "slurm_conf": str(self.shape.slurm_conf),
            "reconcile_interval_s": 2.0,
            "auth": self.auth(),
            # A 4-node partition under the 10% default could lose only one node, and
            # drills inject many faults into the same few nodes: widen both limits.
            "policy": {
                "heartbeat_timeout_s": 30.0,
                "cooldown_s": 5.0,
                "max_unhealthy_fraction": 0.5,
                "lemon_threshold": 100,
                # Agents here probe every second: a shared cause shows on every node
                # within a few seconds, so a short wait suffices.
                "shared_cause_window_s": 3.0,
            },
            "auto_resume": {
                "backoff_base_s": 0.0,
                "fault_window_s": 120.0,
                # where the SPANK plugin points HYPERPOD_CHECKPOINT_DIR: <root>/<jobid>
                "checkpoint_root": str(self.dir / "checkpoints"),
            },
            "provider": {"kind": "spare_pool"},
            "deep_checks": deepchecks.controller_section(self.dir),
        }

    def agent_config(self, node: str) -> dict[str, Any]:
        """What provisioning writes for ``node`` (rendered afresh)."""
        return provisioned.agent_config(self.parameters(), self.shape, node)

    def _agent_common(self) -> dict[str, Any]:
        """agent_overrides: what every fake node's agent has in common."""
        return {
            "slurm_conf": str(self.shape.slurm_conf),
            # Every slurmd reads the first head's plugstack.conf: one marker directory.
            "auto_resume_markers": str(self.dir / "autoresume"),
            "cycle_s": 1.0,
            # A restarted agent waits a little before non-urgent verdicts, as on a
            # booting node; urgent GPU faults are reported at once.
            "verdict": {"grace_s": 5.0},
            "probes": {
                "gpu": {"kmsg_path": "", "interval_s": 1.0},
                "nic": {"interfaces": [hardware.DATA_LINK], "interval_s": 1.0},
                "disk": {"interval_s": 1.0},
                "cpu": {"interval_s": 5.0},
                "slurmd": {"interval_s": 2.0, "munge_socket": str(self.shape.munge_socket)},
                "script": {"enabled": False},
            },
            "controller": {
                "auth": self.auth(),
                "heartbeat_interval_s": 5.0,
                "backoff_max_s": 5.0,
                "self_drain_after_s": 30.0,
                "slurm_conf": str(self.shape.slurm_conf),
                "slurm_user": "root",
            },
        }

    def _agent_node(self, node: str) -> dict[str, Any]:
        """node_overrides: the fake node's own hardware and places (on a real cluster,
        each machine's own paths are the same and these stay out)."""
        return {
            "cache_path": str(self.cache(node)),
            "state_dir": str(self.cache(node).parent),
            "sysfs_root": str(self.dir / "sys" / node),
            # TaskProlog puts each node's memory tiers under memory_root/<node>/<job>.
            "memory_tier": {"root": str(self.shape.memory_root / node)},
            # ... and the ranks' progress records under progress_root/<node>/<job>.
            "progress_dir": str(self.shape.progress_root / node),
            "metrics": {"port": self.metrics_port(node)},
            "probes": {
                # this machine has no GPU: each node's are fakes, whose state a file says
                "gpu": {"backend": "fake", "fake_scenario": str(self.scenario(node))},
                "disk": {"mounts": [{"path": str(self.scratch(node)), "name": "scratch"}]},
            },
        }

    def provision(self) -> None:
        """Everything before the daemons start: the database (its secret is the heads'
        to have), the harness's own files, then every head and node provisioned by
        the lifecycle script from the cluster's parameters."""
        from hyperpod_agent.admin.config import AdminConfig

        if self.shape.ha:
            ha.start_database(self.shape)
        etc = self.dir / "etc"
        deepchecks.install(self.dir)
        # What `hyperpod status/nodes/...` read (with HYPERPOD_LOCAL_CLUSTER_DIR=DIR).
        admin = {"controller": self._controller_keys(), "auth": self.auth()}
        AdminConfig.model_validate(admin)
        (etc / "admin.toml").write_text(to_toml(admin))
        (self.dir / "gpu").mkdir(exist_ok=True)
        for node in self.shape.all_names:
            self.scenario(node).write_text(json.dumps(HEALTHY_GPUS) + "\n")
            self.cache(node).parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.dir / "nodes", ignore_errors=True)
        nodes = [*self.controllers, *self.shape.all_names]
        provisioned.provision(self.shape, self.parameters_data(), nodes)
        heads = list(self.controllers)
        for name in self.controllers:
            root = provisioned.node_root(self.shape, heads, name)
            _relink(self.controller_config_path(name), root / "etc/hyperpod/controller.toml")
        for node in self.shape.all_names:
            root = provisioned.node_root(self.shape, heads, node)
            _relink(self.agent_config_path(node), root / "etc/hyperpod/agent.toml")

    # ------------------------------------------------------------ node hardware
    def make_node_hardware(self, node: str) -> None:
        hardware.make(self.dir / "sys" / node, self.scratch(node), self.netns(node))

    def remove_node_hardware(self, node: str) -> None:
        hardware.remove(self.dir / "sys" / node, self.scratch(node), self.netns(node))

    def set_link(self, node: str, up: bool) -> None:
        hardware.set_link(self.netns(node), up)

    # ---------------------------------------------------------------- processes
    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        pidfile = self.dir / "run" / f"proc-{name}.pid"
        pid = procs.read_pidfile(pidfile)
        if pid is not None:
            return pid
        pid = daemons.start_process(self.shape, argv, f"{name}.log", env)
        procs.write_pidfile(pidfile, pid)
        return pid

    def pid(self, name: str) -> int | None:
        """The pid of service ``name`` (``controller``, ``agent-<node>``) if it runs."""
        return procs.read_pidfile(self.dir / "run" / f"proc-{name}.pid")

    def stop(self, name: str) -> None:
        pid = self.pid(name)
        if pid is not None:
            procs.stop([pid])

    def start_controller(
        self, timeout: float = 30.0, env: dict[str, str] | None = None, name: str = "controller"
    ) -> int:
        """Start controller ``name`` (``env`` adds variables) and wait until it answers."""
        pid = self._start(
            name,
            [
                sys.executable,
                "-m",
                "hyperpod_agent",
                "controller",
                "run",
                "--config",
                str(self.controller_config_path(name)),
            ],
            env,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not procs.alive(pid):
                raise LocalClusterError(f"the {name} exited; see {self.dir}/log/{name}.log")
            try:
                with urllib.request.urlopen(f"{self.url_of(name)}/v1/healthz", timeout=2):
                    return pid
            except OSError:
                time.sleep(0.2)
        raise LocalClusterError(
            f"the {name} did not answer within {timeout:g} s; see {self.dir}/log/{name}.log"
        )

    def start_agent(self, node: str) -> int:
        return self._start(
            f"agent-{node}",
            [
                sys.executable,
                "-m",
                "hyperpod_agent",
                "agent",
                "run",
                "--config",
                str(self.agent_config_path(node)),
            ],
        )

    def up(self) -> None:
        """Provision, then start: the database, controllers and agents."""
        self.provision()
        self.start()

    def start(self) -> None:
        """Start the provisioned services (the node hardware, the controllers, the
        agents); the daemons run."""
        for node in self.shape.all_names:
            self.make_node_hardware(node)
        for name in self.controllers:
            self.start_controller(name=name)
        for node in self.shape.all_names:
            self.start_agent(node)

    def down(self) -> None:
        for node in self.shape.all_names:
            self.stop(f"agent-{node}")
        for name in self.controllers:
            self.stop(name)
        ha.stop_database(self.shape)
        for node in self.shape.all_names:
            self.remove_node_hardware(node)

    def power_off(self, node: str) -> None:
        """The first half of a reboot on the hyperpod side: the agent stops and the
        hardware comes back clean (GPUs healthy, link up, scratch writable). The
        agent starts again (``start_agent``) once the node's slurmd runs, as systemd
        orders it on a real node."""
        if not self.agent_config_path(node).exists():
            return
        self.stop(f"agent-{node}")
        self.scenario(node).write_text(json.dumps(HEALTHY_GPUS) + "\n")
        self.make_node_hardware(node)
        self.set_link(node, True)
        if is_mount(self.scratch(node)):
            subprocess.run(
                ["mount", "-o", "remount,rw", str(self.scratch(node))],
                capture_output=True,
                timeout=10,
            )
