"""The models of ``provisioning_parameters.json`` and ``resource_config.json``
(load.py reads the files).

Every problem is reported before anything is written, one line each, naming the file,
the key path and what was expected, e.g.
``provisioning_parameters.json: worker_groups[0].bogus: unknown key``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from hyperpod_agent.errors import ConfigError, SlurmParseError
from hyperpod_agent.provision import controllers
from hyperpod_agent.provision.controllers import ControllerStore, ControllerUrl
from hyperpod_agent.slurm.hostlist import expand_hostlist

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_NODE_RE = re.compile(NAME_PATTERN)


class ProvisionError(ConfigError):
    """Provisioning parameters are invalid, or a step failed; lists every problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{problems[0]}{more}")


class StepFailed(ProvisionError):
    """A provisioning step could not reach its desired state."""

    exit_code = 6


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _expand_nodes(value: Any) -> Any:
    """Accept a list of names or a Slurm hostlist expression (``node[1-4]``)."""
    if isinstance(value, str):
        try:
            names = expand_hostlist(value)
        except SlurmParseError as exc:
            raise ValueError(f"bad hostlist {value!r}: {exc}") from None
        if not names:
            raise ValueError("empty hostlist")
        return names
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            out.extend(_expand_nodes(item) if isinstance(item, str) and "[" in item else [item])
        return out
    return value


def _check_names(names: list[str]) -> list[str]:
    seen: set[str] = set()
    for name in names:
        if not _NODE_RE.match(name):
            raise ValueError(f"{name!r} is not a valid node name")
        if name in seen:
            raise ValueError(f"node {name} is listed twice")
        seen.add(name)
    return names


NodeList = Annotated[
    list[str],
    BeforeValidator(_expand_nodes),
    AfterValidator(_check_names),
    WithJsonSchema(
        {
            "description": "node names, or a Slurm hostlist expression such as node[1-16]",
            "anyOf": [
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
                {"type": "string", "minLength": 1},
            ],
        }
    ),
]


class _Group(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    nodes: NodeList = Field(min_length=1)


class ControllerGroup(_Group):
    """The head node(s): slurmctld and hyperpod-controller."""

    name: str = Field(default="controller", pattern=NAME_PATTERN)


class LoginGroup(_Group):
    """Login/submit nodes: the plugin, plugstack.conf and the admin CLI."""


class WorkerGroup(_Group):
    """Compute nodes: slurmd and hyperpod-agent."""

    partitions: list[str] = Field(min_length=1)
    instance_type: str | None = None
    gpus: int | None = Field(default=None, ge=0, le=64, description="GPUs per node")
    expected_gpus: int | None = Field(
        default=None, ge=0, le=64, description="GPUs the agent expects; default: gpus"
    )

    @field_validator("partitions", mode="before")
    @classmethod
    def _one_partition(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def expected_gpu_count(self) -> int | None:
        """GPUs the agent should insist on (None: whatever it first sees)."""
        return self.expected_gpus if self.expected_gpus is not None else self.gpus


class Partition(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    default: bool = False


class SparePool(_Model):
    """Spare nodes wait drained (reason ``hyperpod:spare``) to replace faulty ones."""

    nodes: NodeList = Field(min_length=1)
    partition: str


class SharedMount(_Model):
    """A shared filesystem, written to fstab and mounted on every node."""

    path: str = Field(pattern=r"^/.*[^/]$|^/$")
    type: Literal["nfs", "lustre", "other"]
    source: str = Field(min_length=1, pattern=r"^\S+$")
    fstype: str | None = Field(default=None, description="needed when type is 'other'")
    options: str = Field(default="defaults,_netdev", pattern=r"^\S+$")
    required: bool = Field(default=True, description="a failed mount fails provisioning")

    @model_validator(mode="after")
    def _fstype(self) -> SharedMount:
        if self.type == "other" and not self.fstype:
            raise ValueError(f"mount {self.path}: type 'other' needs fstype")
        return self

    def fs_type(self) -> str:
        """The fstab filesystem type."""
        return self.fstype or self.type


class AutoResumeSettings(_Model):
    """Arguments of the ``auto_resume.so`` line in plugstack.conf."""

    statedir: str = Field(default="/var/lib/hyperpod/autoresume", pattern=r"^/")
    step_retry: bool = Field(
        default=True,
        description="srun --auto-resume inside a job retries its step in place (false: "
        "job-level requeue only)",
    )
    checkpoint_root: str | None = Field(default=None, pattern=r"^/")
    max: int | None = Field(default=None, ge=0, le=1_000_000)
    default: int | None = Field(default=None, ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _default_le_max(self) -> AutoResumeSettings:
        if self.default is not None and self.default > (self.max if self.max is not None else 1000):
            raise ValueError("default must not exceed max (1000 when unset)")
        return self


class SlurmSettings(_Model):
    """What provisioning adds to Slurm's configuration."""

    conf_dir: str = Field(default="/etc/slurm", pattern=r"^/")
    plugin_dir: str = Field(default="/opt/hyperpod/lib", pattern=r"^/")
    configless: bool = Field(
        default=True,
        description="slurmd fetches its config from slurmctld: write it on the controller only",
    )
    health_check_interval: int = Field(default=60, ge=1, le=86400)
    reboot_program: str = Field(default="/usr/sbin/reboot", pattern=r"^/")
    cred_expire: int | None = Field(default=None, ge=5, le=3600)
    auto_resume: AutoResumeSettings = Field(default_factory=AutoResumeSettings)


class ProvisioningParameters(_Model):
    """The whole ``provisioning_parameters.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: str | None = Field(default=None, alias="$schema")
    version: Literal[1] = 1
    cluster_name: str = Field(pattern=NAME_PATTERN)
    controller: ControllerGroup
    login_groups: list[LoginGroup] = Field(default_factory=list)
    worker_groups: list[WorkerGroup] = Field(min_length=1)
    partitions: list[Partition] = Field(min_length=1)
    spare_pool: SparePool | None = None
    mounts: list[SharedMount] = Field(default_factory=list)
    controller_url: ControllerUrl | None = Field(
        default=None, description="the controller, http://HOST:PORT"
    )
    controller_urls: list[ControllerUrl] = Field(
        default_factory=list,
        min_length=1,
        description="several controller nodes: one URL each, in the order clients try them",
    )
    controller_store: ControllerStore | None = Field(
        default=None,
        description="the PostgreSQL database the controllers share; needed with more than "
        "one controller node",
    )
    agent_overrides: dict[str, Any] = Field(
        default_factory=dict, description="merged into every agent.toml (AgentConfig)"
    )
    node_overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per worker node: merged into that node's agent.toml after "
        "agent_overrides (hardware that differs: a port never cabled, a GPU count)",
    )
    controller_overrides: dict[str, Any] = Field(
        default_factory=dict, description="merged into controller.toml (ControllerConfig)"
    )
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)

    @model_validator(mode="before")
    @classmethod
    def _controller_present(cls, data: Any) -> Any:
        if isinstance(data, dict) and "controller" not in data:
            raise ValueError('no controller group: add "controller": {"nodes": [...]}')
        return data

    def urls(self) -> tuple[str, ...]:
        """Every controller's URL, in order (one unless there are several head nodes)."""
        return controllers.controller_urls(self.controller_url, self.controller_urls)

    def groups(self) -> Iterator[tuple[str, _Group]]:
        """(kind, group) for every group, controller first."""
        yield "controller", self.controller
        for login in self.login_groups:
            yield "login", login
        for worker in self.worker_groups:
            yield "worker", worker

    @model_validator(mode="after")
    def _cross(self) -> ProvisioningParameters:
        names: dict[str, str] = {}
        owner: dict[str, str] = {}
        for kind, group in self.groups():
            label = f"{kind} group {group.name!r}"
            if group.name in names:
                raise ValueError(f"group name {group.name!r} is used twice")
            names[group.name] = kind
            for node in group.nodes:
                if node in owner:
                    raise ValueError(f"node {node} is in two groups: {owner[node]} and {label}")
                owner[node] = label
        declared = {p.name for p in self.partitions}
        if len(declared) != len(self.partitions):
            raise ValueError("a partition name is declared twice")
        if sum(p.default for p in self.partitions) > 1:
            raise ValueError("more than one partition has default = true")
        for worker in self.worker_groups:
            for part in worker.partitions:
                if part not in declared:
                    raise ValueError(
                        f"worker group {worker.name!r}: partition {part!r} is not declared in "
                        f"partitions ({', '.join(sorted(declared))})"
                    )
        if self.spare_pool is not None:
            self._check_spares(self.spare_pool, declared)
        controllers.check_heads(
            self.controller.nodes, self.urls(), self.controller_store, self.controller_overrides
        )
        workers = {n for w in self.worker_groups for n in w.nodes}
        for node in self.node_overrides:
            if node not in workers:
                raise ValueError(f"node_overrides: {node} is not a node of a worker group")
        paths = [m.path for m in self.mounts]
        for path in paths:
            if paths.count(path) > 1:
                raise ValueError(f"mount path {path} is listed twice")
        return self

    def _check_spares(self, pool: SparePool, declared: set[str]) -> None:
        if pool.partition not in declared:
            raise ValueError(f"spare_pool: partition {pool.partition!r} is not declared")
        eligible = {
            n for w in self.worker_groups if pool.partition in w.partitions for n in w.nodes
        }
        for node in pool.nodes:
            if node not in eligible:
                raise ValueError(
                    f"spare node {node} is not in a worker group of partition {pool.partition!r}"
                )

    def spare_nodes(self) -> set[str]:
        """Names of the spare-pool nodes."""
        return set(self.spare_pool.nodes) if self.spare_pool else set()


class ResourceInstance(_Model):
    node_name: str = Field(pattern=NAME_PATTERN)
    instance_id: str | None = None
    address: str | None = None
    hostname: str | None = None


class ResourceConfig(_Model):
    """``resource_config.json``: which machine is which node."""

    instances: list[ResourceInstance] = Field(min_length=1)

    def resolve(self, *, instance_id: str | None, hostname: str | None, addresses: set[str]) -> str:
        """The node name of this machine: by instance id, then host name, then address."""
        for inst in self.instances:
            if instance_id and inst.instance_id == instance_id:
                return inst.node_name
        for inst in self.instances:
            if hostname and hostname in (inst.hostname, inst.node_name):
                return inst.node_name
        for inst in self.instances:
            if inst.address and inst.address in addresses:
                return inst.node_name
        raise ProvisionError(
            [
                f"resource config: no instance matches this machine (instance id "
                f"{instance_id or '?'}, host name {hostname or '?'})"
            ]
        )


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def describe_errors(source: str, exc: ValidationError) -> list[str]:
    """One line per problem: ``source: key.path: what was expected``."""
    lines = []
    for err in exc.errors():
        msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        where = _loc(tuple(err["loc"]))
        value = err.get("input")
        shown = ""
        if err["type"] not in ("missing", "extra_forbidden", "value_error") and not isinstance(
            value, dict | list
        ):
            shown = f", got {json.dumps(value, default=str)}"
        lines.append(
            f"{source}: {where}: {msg}{shown}" if where != "(top level)" else f"{source}: {msg}"
        )
    return lines
