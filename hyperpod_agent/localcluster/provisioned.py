"""The local cluster's Slurm integration, made by provisioning's own steps.

The harness writes only what a machine and its site would have: a slurm.conf with the
nodes, ports, munge, timeouts and the site's own hooks (a RebootProgram that fakes a
reboot, a TaskProlog that gives each fake node its own /dev/shm roots). Everything
hyperpod adds to Slurm (the include with permit_job_expansion, the Prolog gate, the
health check, the job-end epilog, job_submit.lua, the plugstack line, the plugin) is
written by provision/slurm_steps.py from a provisioning_parameters.json, inside the
cluster directory as a prefix, exactly as ``hyperpod provision`` writes it on a head
node. So every drill runs on the configuration an admin gets.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from hyperpod_agent.errors import LocalClusterError
from hyperpod_agent.localcluster.shape import Shape
from hyperpod_agent.provision import render
from hyperpod_agent.provision.apply import apply_plan
from hyperpod_agent.provision.commands import Build
from hyperpod_agent.provision.layout import Layout
from hyperpod_agent.provision.load import parse_parameters
from hyperpod_agent.provision.models import ProvisionError, ProvisioningParameters
from hyperpod_agent.provision.plan import Plan, Role, default_source
from hyperpod_agent.provision.slurm_steps import slurm_steps
from hyperpod_agent.provision.steps import CopyFile, Directory, ManagedBlock, Step, Symlink

HEAD = "head"
PARTITION = "main"


def parameters_data(shape: Shape, step_retry: bool) -> dict[str, Any]:
    """The provisioning_parameters.json of the local cluster. Paths are as on a real
    node; provisioning relocates them under the cluster directory (the prefix)."""
    spares = shape.spare_names
    data: dict[str, Any] = {
        "cluster_name": "hyperpod-local",
        "controller": {"nodes": [HEAD]},
        "worker_groups": [
            {"name": "compute", "nodes": shape.all_names, "partitions": [PARTITION], "gpus": 8}
        ],
        "partitions": [{"name": PARTITION, "default": True}],
        "controller_url": "http://127.0.0.1:8787",
        # Each fake node has its own progress and memory roots (%n: the node's name, as
        # in the TaskProlog the site's slurm.conf names).
        "agent_overrides": {
            "progress_dir": f"{shape.progress_root}/%n",
            "memory_tier": {"root": f"{shape.memory_root}/%n"},
        },
        "slurm": {
            "conf_dir": "/etc",
            "plugin_dir": "/lib",
            # every node reads the one slurm.conf (no configless slurmd here)
            "configless": False,
            "auto_resume": {
                "statedir": "/autoresume",
                "checkpoint_root": str(shape.dir / "checkpoints"),
                "step_retry": step_retry,
            },
        },
    }
    if spares:
        data["spare_pool"] = {"nodes": spares, "partition": PARTITION}
    return data


def parameters(shape: Shape, step_retry: bool) -> ProvisioningParameters:
    return parse(parameters_data(shape, step_retry))


def parse(data: dict[str, Any]) -> ProvisioningParameters:
    try:
        return parse_parameters(data, "local cluster parameters")
    except ProvisionError as exc:
        raise LocalClusterError("; ".join(exc.problems)) from None


def agent_config(params: ProvisioningParameters, shape: Shape, node: str) -> dict[str, Any]:
    """The agent.toml provisioning writes for ``node`` (validated by the agent's model)."""
    lay = Layout.for_params(params, shape.dir)
    group = next(g for g in params.worker_groups if node in g.nodes)
    data = render.agent_config_data(params, node, group, lay)
    _validate("agent", data, f"agent.toml for {node}")
    return data


def controller_config(params: ProvisioningParameters, shape: Shape, name: str) -> dict[str, Any]:
    """The controller.toml provisioning writes for head node ``name``."""
    lay = Layout.for_params(params, shape.dir)
    data = render.controller_config_data(params, lay, name)
    _validate("controller", data, f"controller.toml for {name}")
    return data


def _validate(component: str, data: dict[str, Any], source: str) -> None:
    try:
        render.render_config(component, data, source, f"{component}_overrides")
    except ValueError as exc:
        raise LocalClusterError(str(exc)) from None


def plan(shape: Shape, step_retry: bool) -> Plan:
    """The head node's Slurm steps, relocated into the cluster directory. The venv is
    the Python running the cluster: the machine has it installed."""
    params = parameters(shape, step_retry)
    lay = Layout.for_params(params, shape.dir)
    source = default_source()
    plugin = os.environ.get("HYPERPOD_SPANK_PLUGIN")
    steps: list[Step] = [
        Directory(lay.log_dir),
        Directory(lay.etc),
        Directory(lay.libexec),
        Symlink(lay.venv, sys.prefix),
    ]
    if plugin:
        steps.append(CopyFile(Path(plugin), lay.plugin, 0o755))
    else:
        steps += [
            Build(source / "spank_plugin"),
            CopyFile(source / "spank_plugin" / "auto_resume.so", lay.plugin, 0o755),
        ]
    steps.append(
        ManagedBlock(lay.slurm_conf_dir / "plugstack.conf", render.plugstack_line(params, lay))
    )
    steps += slurm_steps(params, lay, reconfigure=False)
    return Plan(HEAD, Role("controller", "controller"), lay, steps, [])


def provision(shape: Shape, step_retry: bool) -> None:
    """Write hyperpod's part of the cluster's Slurm configuration (idempotent), and the
    parameters it came from (DIR/etc/provisioning_parameters.json)."""
    (shape.dir / "etc").mkdir(parents=True, exist_ok=True)
    data = parameters_data(shape, step_retry)
    (shape.dir / "etc" / "provisioning_parameters.json").write_text(
        json.dumps(data, indent=2) + "\n"
    )
    try:
        apply_plan(plan(shape, step_retry), verify=False)
    except ProvisionError as exc:
        raise LocalClusterError("provisioning failed: " + "; ".join(exc.problems)) from None
