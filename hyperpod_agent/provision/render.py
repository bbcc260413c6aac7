"""Pure renderers: the content of every file provisioning writes. No I/O here."""

from __future__ import annotations

import copy
import json
import math
import shlex
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from hyperpod_agent.progress.format import DEFAULT_ROOT as DEFAULT_PROGRESS_ROOT
from hyperpod_agent.provision.layout import Layout
from hyperpod_agent.provision.models import ProvisioningParameters, WorkerGroup, describe_errors
from hyperpod_agent.shared_root import DEFAULT_MEMORY_ROOT

HEADER = "Written by `hyperpod provision` from provisioning_parameters.json; edits are replaced."
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


# --- TOML ---------------------------------------------------------------------------------


def _toml_key(key: str) -> str:
    bare = key and all(c.isalnum() or c in "_-" for c in key)
    return key if bare else json.dumps(key)


def _toml_value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v, where) for v in value) + "]"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_toml_key(k)} = {_toml_value(v, where)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    if value is None:
        raise ValueError(f"{where}: null has no TOML form; leave the key out instead")
    raise ValueError(f"{where}: cannot write a {type(value).__name__} to TOML")


def to_toml(data: Mapping[str, Any], header: str = HEADER) -> str:
    """Render nested dicts as TOML: plain keys first, then one ``[table]`` per dict."""
    lines = [f"# {header}"] if header else []

    def table(path: list[str], body: Mapping[str, Any]) -> None:
        plain = {k: v for k, v in body.items() if not isinstance(v, Mapping)}
        subs = {k: v for k, v in body.items() if isinstance(v, Mapping)}
        if path and (plain or not subs):
            lines.append("")
            lines.append("[" + ".".join(_toml_key(p) for p in path) + "]")
        for key, value in plain.items():
            where = ".".join([*path, key])
            lines.append(f"{_toml_key(key)} = {_toml_value(value, where)}")
        for key, value in subs.items():
            table([*path, key], value)

    table([], data)
    return "\n".join(lines) + "\n"


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` wins; nested dicts merge key by key. The result shares nothing with
    either input: parameters parsed once are rendered for many nodes, and an edit to
    one node's config must stay in that config."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# --- config files ---------------------------------------------------------------------------


def agent_config_data(
    params: ProvisioningParameters, node: str, group: WorkerGroup | None, layout: Layout
) -> dict[str, Any]:
    """agent.toml for ``node``, before validation: generated keys, then agent_overrides,
    then the node's own node_overrides."""
    data: dict[str, Any] = {
        "node_name": node,
        "cache_path": str(layout.run_dir / "health.json"),
        "state_dir": str(layout.run_dir),
        # Where the SPANK plugin leaves srun --auto-resume markers for the agent.
        "auto_resume_markers": str(layout.statedir),
        "controller": controller_section(params),
    }
    if observe_mode(params):
        # The agent's one action of its own, self-drain, observes with the controller.
        data["controller"]["mode"] = "observe"
    gpus = group.expected_gpu_count() if group is not None else None
    if gpus == 0:
        data["probes"] = {"gpu": {"enabled": False}}
    elif gpus is not None:
        data["probes"] = {"gpu": {"expected_count": gpus}}
    merged = deep_merge(data, params.agent_overrides)
    return deep_merge(merged, params.node_overrides.get(node, {}))


def observe_mode(params: ProvisioningParameters) -> bool:
    """The controllers run ``[policy] mode = "observe"`` (or the old ``dry_run``)."""
    policy = params.controller_overrides.get("policy")
    if not isinstance(policy, dict):
        return False
    return policy.get("mode") == "observe" or policy.get("dry_run") is True


def controller_section(params: ProvisioningParameters) -> dict[str, Any]:
    """``[controller]`` of agent.toml and admin.toml: ``url``, or ``urls`` when there are
    several controllers (the clients try them in turn)."""
    urls = params.urls()
    return {"url": urls[0]} if len(urls) == 1 else {"urls": list(urls)}


def controller_config_data(
    params: ProvisioningParameters, layout: Layout, node: str
) -> dict[str, Any]:
    """controller.toml for head node ``node``, before validation: generated keys plus
    controller_overrides. Head nodes' files differ only in ``[ha] controller_id``."""
    urls = [urllib.parse.urlsplit(u) for u in params.urls()]
    # Listen where the URLs point: loopback stays private, a real name needs every address.
    private = all(u.hostname in LOOPBACK_HOSTS for u in urls)
    # controller_urls pairs with controller.nodes: each head listens on its own URL's port.
    heads = params.controller.nodes
    port = urls[heads.index(node) if node in heads else 0].port
    data: dict[str, Any] = {
        "listen_host": "127.0.0.1" if private else "0.0.0.0",
        "listen_port": port,
        "state_db": str(layout.state_dir / "controller.db"),
        "slurm_conf": str(layout.slurm_conf_dir / "slurm.conf"),
    }
    store = params.controller_store
    if store is not None:
        data["store"] = store.url
        if store.password_file is not None:
            data["store_password_file"] = str(layout.path(store.password_file))
        if len(params.controller.nodes) > 1:
            data["ha"] = {"enabled": True, "controller_id": f"{node}:{port}", **store.ha_timing()}
    return deep_merge(data, params.controller_overrides)


def admin_config_data(params: ProvisioningParameters) -> dict[str, Any]:
    """admin.toml: where the admin CLI finds the controller, and how it authenticates."""
    auth = params.controller_overrides.get("auth")
    data: dict[str, Any] = {"controller": controller_section(params)}
    if isinstance(auth, Mapping):
        # The client side of the controller's auth; the server-only keys stay out.
        client = {k: auth[k] for k in ("mode", "munge_socket") if k in auth}
        if client:
            data["auth"] = client
    return data


def _model(name: str) -> type[BaseModel] | None:
    """The config model of a component, imported lazily (None if it is not installed)."""
    try:
        if name == "agent":
            from hyperpod_agent.agent.config import AgentConfig

            return AgentConfig
        if name == "controller":
            from hyperpod_agent.controller.config import ControllerConfig

            return ControllerConfig
        from hyperpod_agent.admin.config import AdminConfig

        return AdminConfig
    except ImportError:
        return None


def render_config(name: str, data: Mapping[str, Any], source: str, key: str) -> str:
    """TOML for ``data`` after validating it with the component's own model.

    Raises ValueError with one line per problem, each naming ``source`` and ``key``.
    """
    try:
        text = to_toml(data)
    except ValueError as exc:
        raise ValueError(f"{source}: {key}.{exc}") from None
    if tomllib.loads(text) != json.loads(json.dumps(data, default=str)):
        raise ValueError(f"{source}: {key}: does not survive a TOML round trip")
    model = _model(name)
    if model is not None:
        try:
            model.model_validate(tomllib.loads(text))
        except ValidationError as exc:
            lines = describe_errors(source, exc)
            raise ValueError(
                "\n".join(line.replace(f"{source}: ", f"{source}: {key}.", 1) for line in lines)
            ) from None
    return text


def check_overrides(params: ProvisioningParameters, source: str) -> list[str]:
    """Problems with agent_overrides / controller_overrides, validated on a sample node,
    and with each node's node_overrides on that node."""
    layout = Layout.for_params(params, None)
    group = params.worker_groups[0]
    common = params.model_copy(update={"node_overrides": {}})  # agent_overrides alone
    checks: list[tuple[str, str, Callable[[], Mapping[str, Any]]]] = [
        (
            "agent",
            "agent_overrides",
            lambda: agent_config_data(common, group.nodes[0], group, layout),
        ),
        (
            "controller",
            "controller_overrides",
            lambda: controller_config_data(params, layout, params.controller.nodes[0]),
        ),
    ]
    for node in params.node_overrides:
        worker = next(w for w in params.worker_groups if node in w.nodes)
        checks.append(
            (
                "agent",
                f"node_overrides.{node}",
                partial(agent_config_data, params, node, worker, layout),
            )
        )
    problems: list[str] = []
    for name, key, make in checks:
        try:
            render_config(name, make(), source, key)
        except ValueError as exc:
            problems.extend(str(exc).splitlines())
    return problems


# --- Slurm ----------------------------------------------------------------------------------


def plugstack_line(params: ProvisioningParameters, layout: Layout) -> str:
    """The plugin named explicitly: configless slurmd does not expand wildcards."""
    ar = params.slurm.auto_resume
    # step_helper: an srun --auto-resume inside a job hands itself over to hyperpod's
    # step-retry helper, which runs on the job's nodes.
    args = [f"statedir={layout.statedir}"]
    if ar.step_retry:
        args.append(f"step_helper={layout.hyperpod_bin}")
    # Each job's progress and memory tier directories are made by slurmstepd (root) for
    # the job's user, under the roots the agents read (agent.toml, overrides included).
    progress, memory = node_roots(params)
    args += [f"progress_root={progress}", f"memory_root={memory}"]
    if ar.checkpoint_root:
        args.append(f"checkpoint_root={ar.checkpoint_root}")
    if ar.max is not None:
        args.append(f"max={ar.max}")
    if ar.default is not None:
        args.append(f"default={ar.default}")
    # 'required': a plugin that fails to load makes sbatch/srun fail loudly instead of
    # silently dropping --auto-resume.
    return f"required {layout.plugin} {' '.join(args)}\n"


def node_roots(params: ProvisioningParameters) -> tuple[str, str]:
    """The progress root and the checkpoint memory root of every agent.toml."""
    over = params.agent_overrides
    progress = over.get("progress_dir", DEFAULT_PROGRESS_ROOT)
    memory_tier = over.get("memory_tier")
    memory = DEFAULT_MEMORY_ROOT
    if isinstance(memory_tier, Mapping):
        memory = memory_tier.get("root", DEFAULT_MEMORY_ROOT)
    return str(progress), str(memory)


def unit_dropin(executable: Path, config: Path) -> str:
    """A systemd drop-in pointing the shipped unit at the provisioned venv and config.

    The unit file is copied verbatim; only ExecStart differs per install, and a drop-in
    is systemd's way to change it without editing the unit.
    """
    argv = shlex.join([str(executable), "--config", str(config)])
    return f"# {HEADER}\n[Service]\nExecStart=\nExecStart={argv}\n"


def fstab_block(params: ProvisioningParameters) -> str:
    """fstab lines for the shared filesystems (empty when there are none)."""
    return "".join(f"{m.source} {m.path} {m.fs_type()} {m.options} 0 0\n" for m in params.mounts)
