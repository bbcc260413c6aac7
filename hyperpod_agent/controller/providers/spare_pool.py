"""Spare pool: spares wait drained with reason ``hyperpod:spare`` (DESIGN §5)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hyperpod_agent.controller.providers.base import (
    Handle,
    ProviderError,
    ReplaceStatus,
    SlurmApi,
)
from hyperpod_agent.controller.reasons import SPARE
from hyperpod_agent.slurm.models import Node


class SparePoolProvider:
    """Resume a spare in the failed node's partitions; the failed node stays held."""

    name = "spare_pool"
    resumes_node = False

    def __init__(self, slurm: SlurmApi) -> None:
        self.slurm = slurm

    def prepare(self, node: str, nodes: Mapping[str, Node]) -> dict[str, Any]:
        failed = nodes.get(node)
        parts = set(failed.partitions) if failed else set()
        spares = sorted(
            n.name
            for n in nodes.values()
            if n.reason.strip() == SPARE
            and n.responding
            and n.name != node
            and (not parts or parts & set(n.partitions))
        )
        if not spares:
            raise ProviderError(
                f"no responding spare (reason {SPARE!r}) in partitions "
                f"{','.join(sorted(parts)) or '-'} for {node}"
            )
        return {"spare": spares[0]}

    def replace(self, node: str, reason: str, params: Mapping[str, Any], now: float) -> Handle:
        # Drain first: if we stop between the two calls, capacity is short by one node
        # until the retry resumes the spare, rather than a node doing double duty.
        spare = str(params["spare"])
        nodes = {n.name: n for n in self.slurm.list_nodes()}
        current = nodes.get(node)
        if current is None or not (current.drained and current.reason.strip() == reason.strip()):
            self.slurm.drain(node, reason)
        target = nodes.get(spare)
        if target is not None and target.reason.strip() == SPARE:
            self.slurm.resume(spare)
        return {"spare": spare, "started_at": now}

    def poll(self, handle: Handle, nodes: Mapping[str, Node], now: float) -> ReplaceStatus:
        spare = nodes.get(str(handle.get("spare", "")))
        if spare is None:
            return ReplaceStatus.FAILED
        return ReplaceStatus.PENDING if spare.drained else ReplaceStatus.DONE
