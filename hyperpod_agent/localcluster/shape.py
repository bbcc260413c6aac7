"""What a local cluster looks like: its node names, ports and paths. Plain data,
read by every module of the local cluster and written to DIR/cluster.json."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shape:
    """Everything that decides what the cluster looks like."""

    dir: Path
    nodes: int
    spares: int
    port_base: int
    slurmd_timeout: int = 6
    message_timeout: int = 3
    cred_expire: int = 5
    cpus_per_node: int = 2
    mem_mb_per_node: int = 1000
    ha: bool = False  # two controllers on a PostgreSQL store (localcluster/ha.py)
    # The agents' and the controller's cadences as shipped (agent cycle and probe
    # intervals, heartbeats, reconcile pass) instead of the drills' short ones.
    shipped_cadences: bool = False
    # The site already has its own HealthCheckProgram, Prolog, EpilogSlurmctld and
    # job_submit.lua (render.site_hooks), which provisioning must keep running.
    site_hooks: bool = False
    # The machine and site only: nothing of hyperpod is provisioned (no include, no
    # plugstack line, no plugin), for a drill that installs it by hand
    # (docs/manual-install.md).
    bare: bool = False

    @property
    def node_names(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.nodes + 1)]

    @property
    def spare_names(self) -> list[str]:
        return [f"node{k}" for k in range(self.nodes + 1, self.nodes + self.spares + 1)]

    @property
    def all_names(self) -> list[str]:
        return self.node_names + self.spare_names

    def node_port(self, name: str) -> int:
        return self.port_base + 10 + int(name.removeprefix("node"))

    @property
    def slurm_conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.sock"

    @property
    def memory_root(self) -> Path:
        """Where the nodes' checkpoint memory tiers live (a /dev/shm per node)."""
        return Path(f"/dev/shm/hyperpod-local-{self.port_base}")

    @property
    def progress_root(self) -> Path:
        """Where the nodes' training progress records live (a /dev/shm per node)."""
        return Path(f"/dev/shm/hyperpod-local-{self.port_base}-progress")

    @property
    def ports(self) -> list[int]:
        return [self.port_base] + [self.node_port(n) for n in self.all_names]
