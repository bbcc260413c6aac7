"""From parameters and a node name to the ordered list of steps that provision it.

Pure: no file is read or written here. Every config file is rendered
and validated by its component's own model now, so invalid parameters fail before any
step runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import hyperpod_agent
from hyperpod_agent.provision import render
from hyperpod_agent.provision.commands import Build, InstallPackage, Mount, SystemdEnable
from hyperpod_agent.provision.join import MARKER, JoinDrained
from hyperpod_agent.provision.layout import Layout
from hyperpod_agent.provision.models import ProvisionError, ProvisioningParameters, WorkerGroup
from hyperpod_agent.provision.slurm_steps import node_hook_steps, slurm_steps
from hyperpod_agent.provision.steps import (
    CopyFile,
    Directory,
    File,
    ManagedBlock,
    Secret,
    Step,
    Symlink,
)
from hyperpod_agent.provision.verify import Check, ControllerAnswers, HealthCacheOk, OneAgentCycle
from hyperpod_agent.slurm.client import SlurmClient

RoleKind = Literal["controller", "login", "worker"]
AGENT_UNIT = "hyperpod-agent.service"
CONTROLLER_UNIT = "hyperpod-controller.service"
WANTED_BY = "multi-user.target"


def default_source() -> Path:
    """The repository this package was installed from (holds systemd/ and spank_plugin/)."""
    return Path(hyperpod_agent.__file__).resolve().parents[1]


@dataclass(frozen=True)
class Role:
    """What a node is, from the group that lists it."""

    kind: RoleKind
    group: str
    spare: bool = False

    def __str__(self) -> str:
        return f"{self.kind} (group {self.group}{', spare' if self.spare else ''})"


@dataclass(frozen=True)
class Options:
    """How to provision, as opposed to what."""

    prefix: Path | None = None
    source: Path = field(default_factory=default_source)
    skip_install: bool = False
    package: str | None = None  # pip requirement or wheel; default: the source directory
    python: str = sys.executable
    verify_timeout_s: float = 120.0


@dataclass(frozen=True)
class Plan:
    """The role of the node, its steps in order, and the checks that end a run."""

    node: str
    role: Role
    layout: Layout
    steps: list[Step]
    checks: list[Check]


def find_role(params: ProvisioningParameters, node: str) -> tuple[Role, WorkerGroup | None]:
    """The node's role; ProvisionError naming the groups when it is in none."""
    for kind, group in params.groups():
        if node in group.nodes:
            worker = group if isinstance(group, WorkerGroup) else None
            spare = node in params.spare_nodes()
            return Role(kind, group.name, spare), worker  # type: ignore[arg-type]
    names = ", ".join(f"{k} {g.name!r}" for k, g in params.groups())
    raise ProvisionError([f"node {node} is in no group of the parameters ({names})"])


def _config(name: str, data: dict[str, object], node: str, key: str) -> str:
    try:
        return render.render_config(name, data, f"{name}.toml for {node}", key)
    except ValueError as exc:
        raise ProvisionError(str(exc).splitlines()) from None


def build_plan(params: ProvisioningParameters, node: str, options: Options) -> Plan:
    """Every step that provisions ``node``, and how to verify it afterwards."""
    role, worker = find_role(params, node)
    lay = Layout.for_params(params, options.prefix)
    steps: list[Step] = [
        Directory(lay.etc),
        Directory(lay.log_dir),
        # 0750 as the controller unit's StateDirectoryMode, or each would undo the other.
        Directory(lay.state_dir, 0o750),
        Directory(lay.run_dir),
        Directory(lay.libexec),
        Directory(lay.statedir),
        Directory(lay.slurm_conf_dir),
    ]
    observing = render.observe_mode(params) and not role.spare
    if role.kind == "worker" and lay.prefix is None and not observing:
        # A new worker is checked before its first job; inside a prefix nothing is
        # asked of Slurm (like systemctl and mounts). In observe mode a worker is not
        # drained (the controller would never resume it); a spare still joins the pool
        # the parameters name.
        marker = lay.state_dir / MARKER
        steps.append(JoinDrained(node, role.spare, marker, partial(_slurm_client, params, lay)))
    install: list[str] = []
    if not options.skip_install:
        spec = options.package or str(options.source)
        step = InstallPackage(lay.venv, spec, options.python)
        steps.append(step)
        install.append(step.name)
    steps.extend(_mount_steps(params, lay))
    plugin_src = options.source / "spank_plugin"
    steps += [
        Build(plugin_src),
        CopyFile(plugin_src / "auto_resume.so", lay.plugin, 0o755),
        ManagedBlock(lay.slurm_conf_dir / "plugstack.conf", render.plugstack_line(params, lay)),
    ]
    if role.kind == "controller" or not params.slurm.configless:
        # slurmctld reads the new include once told to; inside a prefix nothing is
        # asked of Slurm, and the other nodes' slurmd follow the controller's order.
        told = role.kind == "controller" and lay.prefix is None
        steps.extend(slurm_steps(params, lay, reconfigure=told))
    else:
        steps.extend(node_hook_steps(lay))
    checks: list[Check] = []
    if role.kind == "worker":
        text = _config(
            "agent", render.agent_config_data(params, node, worker, lay), node, "agent_overrides"
        )
        config = File(lay.etc / "agent.toml", text, 0o644)
        steps.append(config)
        steps.extend(
            _unit_steps(
                AGENT_UNIT, "hyperpod-agent", config.path, options, lay, [config.name, *install]
            )
        )
        hyperpod = (
            [str(lay.hyperpod_bin)]
            if not options.skip_install
            else [options.python, "-m", "hyperpod_agent"]
        )
        if options.prefix is not None:
            # Nothing runs the agent inside a prefix: run one cycle of it instead.
            checks.append(OneAgentCycle(hyperpod, config.path))
        else:
            checks.append(HealthCacheOk(hyperpod, config.path, options.verify_timeout_s))
    if role.kind == "controller":
        store = params.controller_store
        if store is not None and store.password_file is not None:
            # The site's secret: checked, never written (under a prefix, inside it).
            steps.append(Secret(lay.path(store.password_file), "controller_store.password_file"))
        text = _config(
            "controller",
            render.controller_config_data(params, lay, node),
            node,
            "controller_overrides",
        )
        config = File(lay.etc / "controller.toml", text, 0o640)
        steps.append(config)
        steps.extend(
            _unit_steps(
                CONTROLLER_UNIT,
                "hyperpod-controller",
                config.path,
                options,
                lay,
                [config.name, *install],
            )
        )
    # Every node gets admin.toml: on workers, the step-retry helper of a job's
    # srun --auto-resume finds the controller there.
    key = "controller_url" if params.controller_url is not None else "controller_urls"
    admin = _config("admin", render.admin_config_data(params), node, key)
    steps.append(File(lay.etc / "admin.toml", admin, 0o644))
    if role.kind in ("controller", "login"):
        checks.append(ControllerAnswers(params.urls(), options.verify_timeout_s))
    return Plan(node, role, lay, steps, checks)


def _slurm_client(params: ProvisioningParameters, lay: Layout) -> SlurmClient:
    """Slurm as the node's agent sees it: the agent's ``slurm_conf`` if one is set, else
    the local slurm.conf, else (configless, slurmd not started yet) Slurm's own lookup."""
    named = params.agent_overrides.get("slurm_conf")
    conf = Path(str(named)) if named else lay.slurm_conf_dir / "slurm.conf"
    return SlurmClient(conf if conf.exists() else None)


def _mount_steps(params: ProvisioningParameters, lay: Layout) -> list[Step]:
    steps: list[Step] = [ManagedBlock(lay.fstab, render.fstab_block(params))]
    if lay.prefix is None:
        # Inside a prefix the fstab is written but nothing is mounted.
        steps += [Mount(m.path, m.required) for m in params.mounts]
    return steps


def _unit_steps(
    unit: str, executable: str, config: Path, options: Options, lay: Layout, restart_on: list[str]
) -> list[Step]:
    copy = CopyFile(options.source / "systemd" / unit, lay.systemd_dir / unit, 0o644)
    dropin = File(
        lay.systemd_dir / f"{unit}.d" / "provision.conf",
        render.unit_dropin(lay.venv / "bin" / executable, config),
        0o644,
    )
    if lay.prefix is not None:
        # What `systemctl enable` would do; systemctl itself is not ours to call in a prefix.
        link = lay.systemd_dir / f"{WANTED_BY}.wants" / unit
        return [copy, dropin, Symlink(link, f"../{unit}")]
    return [copy, dropin, SystemdEnable(unit, [copy.name, dropin.name, *restart_on])]
