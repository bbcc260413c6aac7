"""Local provider: for the local cluster, a "new machine" is the node's slurmd
restarted with a fresh boot identity (``hyperpod local-cluster node-reboot``)."""

from __future__ import annotations

import sys
from pathlib import Path

from hyperpod_agent.controller.providers.base import SlurmApi
from hyperpod_agent.controller.providers.command import CommandProvider


class LocalProvider(CommandProvider):
    name = "local"

    def __init__(self, slurm: SlurmApi, cluster_dir: Path, timeout_s: float) -> None:
        command = [
            sys.executable,
            "-m",
            "hyperpod_agent",
            "local-cluster",
            "node-reboot",
            "--dir",
            str(cluster_dir),
        ]
        super().__init__(slurm, command, timeout_s)
