"""Misconfigurations of one node of the local cluster, made the way a site makes them:
a port nobody cabled, an agent.toml an admin wrote, the agent under the shipped
unit's sandbox.

- ``RocePort``: a second RoCE port whose cable is not there. Its netdev is a real veth
  in the node's network namespace whose peer stays down, so the kernel's own
  ``carrier_up_count`` says whether it was ever up; its HCA's sysfs directory is
  written the way the mlx5 driver shows a RoCE port (this machine has no RDMA device
  and no rxe module, as it has no GPU). The node's agent reads it through a sysfs root
  that is the node's own sysfs view with the HCA added.
- ``UnitSandbox``: what ``ProtectSystem=strict``, ``ReadWritePaths=`` and
  ``RuntimeDirectory=`` of a unit (and its drop-ins) let the agent write, read from the
  unit file itself; ``start_sandboxed_agent`` runs the node's agent in a mount
  namespace of its own where exactly that is writable, as systemd would (there is no
  systemd PID 1 here).
- ``write_agent_config`` / ``restore_agent_config``: the node's agent.toml, validated as
  the agent validates it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.localcluster import daemons, procs
from hyperpod_agent.localcluster.services import Services, to_toml
from hyperpod_agent.probes._links import SEEN_UP_FILE

REPO = Path(__file__).resolve().parents[2]
SHIPPED_UNIT = REPO / "systemd" / "hyperpod-agent.service"
CMD_TIMEOUT = 20.0
# ProtectSystem=strict leaves the API file systems writable (systemd.exec(5)).
API_FILESYSTEMS = ("/dev", "/proc", "/sys")


def _ip(*args: str, check: bool = True) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=CMD_TIMEOUT)
    if check and res.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)}: {res.stderr.strip()}")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------ agent.toml
def agent_config_path(services: Services, node: str) -> Path:
    return services.dir / "etc" / f"agent-{node}.toml"


def write_agent_config(services: Services, node: str, config: dict[str, Any]) -> None:
    """Replace ``node``'s agent.toml with ``config``, refused as the agent would
    refuse it; the running agent reads it when it restarts."""
    AgentConfig.model_validate(config)
    _write_atomic(agent_config_path(services, node), to_toml(config))


def restore_agent_config(services: Services, node: str) -> None:
    """``node``'s agent.toml as the local cluster writes it."""
    write_agent_config(services, node, services.agent_config(node))


# ------------------------------------------------------------------- the uncabled port
class RocePort:
    """Port 1 of RoCE HCA ``device`` on ``node``, its netdev ``netdev`` a veth whose
    peer (the far end of the cable) starts down. ``root`` becomes the sysfs root to
    give the node's agent: the node's sysfs view (its network namespace's interfaces,
    its CPUs) with this HCA under ``class/infiniband``."""

    def __init__(
        self,
        services: Services,
        node: str,
        root: Path,
        device: str = "roce0",
        netdev: str = "data1",
        peer: str = "cable1",
    ) -> None:
        self.services = services
        self.node = node
        self.root = root
        self.device = device
        self.netdev = netdev
        self.peer = peer
        self.link_downed = 0
        self.up = False
        self.view = services.dir / "sys" / node  # the node's own sysfs (services.py)
        # The agent's memory of the ports it saw up this boot: /run/hyperpod, a tmpfs a
        # real reboot empties (the local cluster's does not).
        self.seen_up = services.cache(node).parent / SEEN_UP_FILE

    @property
    def component(self) -> str:
        """How the nic probe names the port."""
        return f"{self.device}/1"

    @property
    def _port_dir(self) -> Path:
        return self.root / "class" / "infiniband" / self.device / "ports" / "1"

    def install(self) -> None:
        """The netdev up on the host side, no carrier (nothing at the other end), and
        the HCA's directory showing the port DOWN."""
        self.seen_up.unlink(missing_ok=True)
        ns = self.services.netns(self.node)
        _ip("-n", ns, "link", "add", self.netdev, "type", "veth", "peer", "name", self.peer)
        _ip("-n", ns, "link", "set", self.netdev, "up")
        (self.root / "class").mkdir(parents=True)
        (self.root / "class" / "net").symlink_to(self.view / "class" / "net")
        (self.root / "devices").symlink_to(self.view / "devices")
        (self._port_dir / "counters").mkdir(parents=True)
        net = self.root / "class" / "infiniband" / self.device / "device" / "net"
        net.mkdir(parents=True)
        (net / self.netdev).symlink_to(self.view / "class" / "net" / self.netdev)
        self._show()

    def netdev_attr(self, name: str) -> int | None:
        """An integer attribute of the port's netdev as the kernel shows it."""
        try:
            text = (self.view / "class" / "net" / self.netdev / name).read_text().strip()
            return int(text)
        except (OSError, ValueError):
            return None

    def cable(self, up: bool, timeout: float = 10.0) -> None:
        """Plug (or pull) the cable: the peer up or down, and once the kernel shows
        the carrier follow, the port's state as the driver then shows it."""
        _ip("-n", self.services.netns(self.node), "link", "set", self.peer, "up" if up else "down")
        deadline = time.monotonic() + timeout
        while self.netdev_attr("carrier") != int(up):
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.netdev}: carrier not {int(up)} after {timeout:g} s")
            time.sleep(0.05)
        if self.up and not up:
            self.link_downed += 1  # LinkUp -> down, as the HCA counts it
        self.up = up
        self._show()

    def _show(self) -> None:
        port = self._port_dir
        _write_atomic(port / "state", "4: ACTIVE\n" if self.up else "1: DOWN\n")
        _write_atomic(port / "phys_state", "5: LinkUp\n" if self.up else "3: Disabled\n")
        _write_atomic(port / "rate", "100 Gb/sec (4X EDR)\n")
        for counter in ("symbol_error", "port_rcv_errors", "link_error_recovery"):
            _write_atomic(port / "counters" / counter, "0\n")
        _write_atomic(port / "counters" / "link_downed", f"{self.link_downed}\n")

    def remove(self) -> None:
        _ip("-n", self.services.netns(self.node), "link", "del", self.netdev, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        self.seen_up.unlink(missing_ok=True)


# ------------------------------------------------------------------ the unit's sandbox
def unit_settings(*texts: str) -> dict[str, list[str]]:
    """The ``[Service]`` settings of a unit and then its drop-ins, each key's words in
    order: list settings accumulate, an empty assignment resets (systemd.syntax(7));
    for a single-valued setting the last word wins."""
    settings: dict[str, list[str]] = {}
    for text in texts:
        section = ""
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, sep, value = line.partition("=")
            if section != "Service" or not sep:
                continue
            if value.strip():
                settings.setdefault(key.strip(), []).extend(value.split())
            else:
                settings[key.strip()] = []
    return settings


@dataclass(frozen=True)
class UnitSandbox:
    """What a unit's file-system sandbox lets its service write (systemd.exec(5))."""

    protect_system: str
    read_write_paths: tuple[str, ...]
    runtime_directories: tuple[str, ...]

    @classmethod
    def of(cls, unit: str, *dropins: str) -> UnitSandbox:
        settings = unit_settings(unit, *dropins)
        return cls(
            protect_system=(settings.get("ProtectSystem") or ["no"])[-1],
            read_write_paths=tuple(settings.get("ReadWritePaths", [])),
            runtime_directories=tuple(f"/run/{d}" for d in settings.get("RuntimeDirectory", [])),
        )

    def writable(self, where: Mapping[str, Path]) -> list[Path]:
        """The paths the service may write besides the API file systems, each unit path
        translated by ``where`` (where this node keeps its ``/run/hyperpod`` or
        ``/scratch``); a path ``where`` does not name is this machine's own. A ``-``
        prefix skips a missing path, as systemd does."""
        if self.protect_system != "strict":
            raise AssertionError(
                f"the drill emulates ProtectSystem=strict; the unit now says "
                f"ProtectSystem={self.protect_system}: make the drill follow it"
            )
        paths: list[Path] = []
        for entry in (*self.runtime_directories, *self.read_write_paths):
            path = entry.lstrip("-+")
            local = Path(where.get(path, path))
            if not local.exists():
                if entry.startswith("-"):
                    continue
                raise AssertionError(f"{path} (here {local}) does not exist")
            paths.append(local)
        return list(dict.fromkeys(paths))


# Runs as ``python -c SANDBOX <spec> <argv...>`` inside ``unshare --mount
# --propagation private``: a mount namespace of its own, so nothing done here reaches
# the node's. Every mount but the API file systems is remounted read-only for this
# namespace only (a bind remount changes the mount, not the file system), then each
# writable path is bind-mounted onto itself read-write, which is what systemd does
# for ReadWritePaths=; then it becomes the agent.
SANDBOX = r"""
import json, os, re, subprocess, sys
spec, argv = json.loads(sys.argv[1]), sys.argv[2:]
def within(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)
def mount(*args):
    res = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=20)
    if res.returncode:
        sys.exit(f"sandbox: couldn't mount {' '.join(args)}: {res.stderr.strip()}")
points = []
with open("/proc/self/mountinfo") as table:
    for line in table:
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if point not in points:
            points.append(point)
for point in points:
    if not within(point, spec["api"]) and not within(point, spec["writable"]):
        mount("-o", "remount,bind,ro", point)
for path in spec["writable"]:
    mount("--bind", path, path)
    mount("-o", "remount,bind,rw", path)
print(f"sandbox: read-only but {', '.join(spec['api'] + spec['writable'])}", flush=True)
os.execvp(argv[0], argv)
"""


def restart_agent_under(services: Services, node: str, wrapper: list[str]) -> int:
    """Restart ``node``'s agent with ``wrapper`` before its command line (each wrapper
    execs the next, so the pid is the agent's from the start); its pid. The pid goes in
    the pid file the cluster starts and stops agents by, so a reboot of the node stops
    it like any agent and starts an ordinary one."""
    services.stop(f"agent-{node}")
    argv = [
        *wrapper,
        sys.executable,
        "-m",
        "hyperpod_agent",
        "agent",
        "run",
        "--config",
        str(agent_config_path(services, node)),
    ]
    pid = daemons.start_process(services.shape, argv, f"agent-{node}.log")
    procs.write_pidfile(services.dir / "run" / f"proc-agent-{node}.pid", pid)
    return pid


def start_sandboxed_agent(services: Services, node: str, writable: list[Path]) -> int:
    """Restart ``node``'s agent inside the sandbox that leaves only ``writable`` (and
    the API file systems) writable; its pid."""
    spec = json.dumps({"api": list(API_FILESYSTEMS), "writable": [str(p) for p in writable]})
    wrapper = ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", SANDBOX]
    return restart_agent_under(services, node, [*wrapper, spec])


# ``python -c RENAMED <host name> <argv...>`` inside ``unshare --uts``: the machine's
# host name for this process and its children only.
RENAMED = (
    "import os, socket, sys; socket.sethostname(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"
)


def start_agent_on_host(services: Services, node: str, host: str) -> int:
    """Restart ``node``'s agent on a machine whose host name is ``host``; its pid."""
    return restart_agent_under(
        services, node, ["unshare", "--uts", sys.executable, "-c", RENAMED, host]
    )


def probe_in_namespace_of(
    services: Services, pid: int, probe: str, config: dict[str, Any]
) -> dict[str, Any]:
    """``hyperpod probe run <probe> --json`` with ``config``, run once in the mount
    namespace of process ``pid`` (a sandboxed agent's): what the probe makes of the
    mounts as that agent sees them."""
    AgentConfig.model_validate(config)
    path = services.dir / "etc" / f"probe-{probe}-{pid}.toml"
    path.write_text(to_toml(config))
    try:
        res = subprocess.run(
            ["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--", sys.executable, "-m",
             "hyperpod_agent", "probe", "run", probe, "--json", "--config", str(path)],
            env=daemons.cluster_env(services.shape),
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
    finally:
        path.unlink(missing_ok=True)
    if res.returncode not in (0, 1):
        raise AssertionError(f"probe run {probe}: rc {res.returncode}: {res.stderr.strip()}")
    results: list[dict[str, Any]] = json.loads(res.stdout)
    return results[0]


def mount_table(pid: int) -> dict[str, tuple[str, bool]]:
    """Mount point -> (file system type, read-only) as process ``pid`` sees them (the
    visible mount of a stack)."""
    table: dict[str, tuple[str, bool]] = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        options = set(fields[5].split(",")) | set(fields[sep + 3].split(","))
        table[fields[4]] = (fields[sep + 1], "ro" in options)
    return table


def mount_tmpfs(path: Path, label: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", label, str(path)],
        check=True,
        capture_output=True,
        timeout=CMD_TIMEOUT,
    )


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=CMD_TIMEOUT)
