"""Spare pool: spares wait drained with reason ``hyperpod:spare`` (DESIGN §5)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hyperpod_agent.controller.providers.base import (
    Handle,
    ProviderError,
    ReplaceStatus,
    SlurmApi,
)
from hyperpod_agent.reasons import SPARE
from hyperpod_agent.slurm.models import Node


class SparePoolProvider:
    """Resume a spare in the failed node's partitions; the failed node stays held."""

    name = "spare_pool"
    resumes_node = False
    runs_once = False  # two scontrol calls, each checked first: safe to repeat

    def __init__(self, slurm: SlurmApi) -> None:
        self.slurm = slurm

    def prepare(
        self, node: str, nodes: Mapping[str, Node], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Confirm the spare the policy promised (it alone knows which spares are
        healthy); never pick one of our own."""
        spare = params.get("spare")
        if not spare:
            why = params.get("no_spare") or "no spare ready"
            raise ProviderError(f"{why} for {node}")
        target = nodes.get(str(spare))
        if target is None or target.reason.strip() != SPARE or not target.responding:
            raise ProviderError(f"spare {spare} is no longer a responding spare")
        return {"spare": str(spare)}

    def replace(
        self,
        node: str,
        reason: str,
        params: Mapping[str, Any],
        now: float,
        keepalive: Callable[[], None] | None = None,
    ) -> Handle:
        # Drain first: if we stop between the two calls, capacity is short by one node
        # until the retry resumes the spare, rather than a node doing double duty.
        spare = str(params["spare"])
        nodes = {n.name: n for n in self.slurm.list_nodes()}
        current = nodes.get(node)
        if current is None or not (current.drained and current.reason.strip() == reason.strip()):
            self.slurm.drain(node, reason)
        target = nodes.get(spare)
        if target is None:
            raise ProviderError(f"spare {spare} is no longer in Slurm")
        if target.reason.strip() == SPARE:
            self.slurm.resume(spare)
        elif target.drained:
            # Taken by somebody else since it was promised: never resume their node.
            raise ProviderError(f"spare {spare} was taken since: its reason is {target.reason!r}")
        return {"spare": spare, "started_at": now}

    def poll(self, handle: Handle, nodes: Mapping[str, Node], now: float) -> ReplaceStatus:
        spare = nodes.get(str(handle.get("spare", "")))
        if spare is None:
            return ReplaceStatus.FAILED
        return ReplaceStatus.PENDING if spare.drained else ReplaceStatus.DONE
