"""Command provider: an admin executable replaces the machine; it returns under the
same node name (DESIGN §5)."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Mapping
from typing import Any

from hyperpod_agent.controller.providers.base import (
    Handle,
    ProviderError,
    ReplaceStatus,
    SlurmApi,
)
from hyperpod_agent.slurm.models import Node

log = logging.getLogger(__name__)


def came_back(node: Node | None, since: float) -> bool:
    """The node registered again after ``since``: slurmd started (or booted) later."""
    if node is None or not node.responding:
        return False
    started = [t.timestamp() for t in (node.slurmd_start_time, node.boot_time) if t]
    return bool(started) and max(started) > since


class CommandProvider:
    """Runs ``command + [node]``; a zero exit starts the wait for the node."""

    name = "command"
    resumes_node = True

    def __init__(self, slurm: SlurmApi, command: list[str], timeout_s: float) -> None:
        self.slurm = slurm
        self.command = list(command)
        self.timeout_s = timeout_s

    def prepare(
        self, node: str, nodes: Mapping[str, Node], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        return {}

    def replace(self, node: str, reason: str, params: Mapping[str, Any], now: float) -> Handle:
        self.slurm.drain(node, reason)
        argv = [*self.command, node]
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ProviderError(f"{argv[0]} {node}: {exc}") from exc
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or [""])[-1]
            raise ProviderError(f"{argv[0]} {node}: exit {proc.returncode}: {tail}")
        log.info("replacement command for %s finished", node)
        return {"node": node, "started_at": now, "deadline": now + self.timeout_s}

    def poll(self, handle: Handle, nodes: Mapping[str, Node], now: float) -> ReplaceStatus:
        if came_back(nodes.get(str(handle["node"])), float(handle["started_at"])):
            return ReplaceStatus.DONE
        if now > float(handle.get("deadline", now)):
            return ReplaceStatus.FAILED
        return ReplaceStatus.PENDING
