"""The local cluster configured by the lifecycle scripts, as an admin's nodes are.

The harness writes only what a machine and its site would have: a slurm.conf with the
nodes, ports, munge, timeouts and the site's own hooks (a RebootProgram that fakes a
reboot, a TaskProlog that gives each fake node its own /dev/shm roots), hyperpod
installed (the venv running the cluster, linked where provisioning looks for it), the
database's secret, and a provisioning_parameters.json. Everything hyperpod adds (the
Slurm include with permit_job_expansion, the Prolog gate, the health check, the job-end
epilog, job_submit.lua, the plugstack line and plugin, controller.toml, every
agent.toml, admin.toml) is written by ``lifecycle_scripts/on_create.sh``, run once per
node exactly as on a new instance, with the node's root as ``--prefix``.

The first head's root is the cluster directory itself: its Slurm files are the ones
the daemons read. Every other node has its own root under DIR/nodes/<node>, with its
own copy of the site's slurm.conf, as a separate machine would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hyperpod_agent.errors import LocalClusterError
from hyperpod_agent.localcluster.shape import Shape
from hyperpod_agent.provision import render
from hyperpod_agent.provision.layout import Layout
from hyperpod_agent.provision.load import parse_parameters
from hyperpod_agent.provision.models import ProvisionError, ProvisioningParameters
from hyperpod_agent.provision.plan import default_source

HEAD = "head"
PARTITION = "main"
ON_CREATE = Path("lifecycle_scripts") / "on_create.sh"
ON_CREATE_TIMEOUT_S = 300.0  # the first run builds the SPANK plugin


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


def node_root(shape: Shape, heads: list[str], node: str) -> Path:
    """Where ``node``'s provisioning writes (its ``--prefix``): the cluster directory for
    the first head, DIR/nodes/<node> for every other node."""
    return shape.dir if node == heads[0] else shape.dir / "nodes" / node


def agent_config(params: ProvisioningParameters, shape: Shape, node: str) -> dict[str, Any]:
    """The agent.toml provisioning writes for ``node`` (validated by the agent's model)."""
    lay = Layout.for_params(params, node_root(shape, params.controller.nodes, node))
    group = next(g for g in params.worker_groups if node in g.nodes)
    data = render.agent_config_data(params, node, group, lay)
    _validate("agent", data, f"agent.toml for {node}")
    return data


def controller_config(params: ProvisioningParameters, shape: Shape, name: str) -> dict[str, Any]:
    """The controller.toml provisioning writes for head node ``name``."""
    lay = Layout.for_params(params, node_root(shape, params.controller.nodes, name))
    data = render.controller_config_data(params, lay, name)
    _validate("controller", data, f"controller.toml for {name}")
    return data


def _validate(component: str, data: dict[str, Any], source: str) -> None:
    try:
        render.render_config(component, data, source, f"{component}_overrides")
    except ValueError as exc:
        raise LocalClusterError(str(exc)) from None


def provision(shape: Shape, data: dict[str, Any], nodes: Iterable[str]) -> None:
    """Provision ``nodes`` from ``data`` through the lifecycle script (idempotent),
    after writing the parameters to DIR/etc/provisioning_parameters.json."""
    params = parse(data)  # a clear error before any script runs
    etc = shape.dir / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    params_file = etc / "provisioning_parameters.json"
    params_file.write_text(json.dumps(data, indent=2) + "\n")
    for node in nodes:
        root = node_root(shape, params.controller.nodes, node)
        _supply_machine(shape, params, root)
        _on_create(params_file, node, root)


def _supply_machine(shape: Shape, params: ProvisioningParameters, root: Path) -> None:
    """What a node has before its lifecycle script runs: hyperpod installed (the venv
    running the cluster, where provisioning looks for it, so ``--skip-install``), and on
    a node of its own, the site's slurm.conf and the database's secret."""
    lay, site = Layout.for_params(params, root), Layout.for_params(params, shape.dir)
    hyperpod = Path(sys.prefix) / "bin" / "hyperpod"
    if not hyperpod.exists():
        raise LocalClusterError(f"{hyperpod}: no such file (install the package into {sys.prefix})")
    _link(lay.venv, Path(sys.prefix))
    if root == shape.dir:
        return
    conf = lay.slurm_conf_dir / "slurm.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    # Every node has the site's slurm.conf; paths into the site's /etc name this
    # node's own /etc (its plugstack.conf, its job_submit.lua).
    here, there = f"{site.slurm_conf_dir}/", f"{lay.slurm_conf_dir}/"
    text = shape.slurm_conf.read_text().replace(here, there)
    conf.write_text(text)
    store = params.controller_store
    if store is not None and store.password_file is not None:
        _link(lay.path(store.password_file), site.path(store.password_file))


def _link(path: Path, target: Path) -> None:
    if path.is_symlink() and path.resolve() == target.resolve():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.symlink_to(target)


def _on_create(params_file: Path, node: str, root: Path) -> None:
    script = default_source() / ON_CREATE
    argv = ["bash", str(script), "--params", str(params_file), "--node", node]
    argv += ["--prefix", str(root), "--skip-install", "--skip-verify"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=ON_CREATE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LocalClusterError(
            f"{script} for {node} did not finish in {ON_CREATE_TIMEOUT_S:g} s"
        ) from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise LocalClusterError(f"provisioning {node} failed (exit {proc.returncode}): {tail}")
