"""A newly provisioned worker joins Slurm drained, for the controller to check first.

On a worker's first provisioning (no marker yet in the state directory) the node is
drained with ``hyperpod:check provision new`` (a spare: ``hyperpod:spare``). The
controller's re-entry gate then runs the deep checks on it and resumes it once it
passed, or resumes it once its agent reports it healthy when no deep-check suite is
configured (docs/deep-checks.md, "Gates"). The marker is written afterwards, so a
re-run of provisioning never drains the node again.

The one owner rule applies: only a node in service or under Slurm's own reason is
drained; a node somebody else drained (a human, another tool, the controller itself
while it replaces the machine) is left as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Protocol

from hyperpod_agent.errors import SlurmError
from hyperpod_agent.provision.steps import Change, Context, Step, StepError, write_atomic
from hyperpod_agent.reasons import FIRST_USE, SPARE, Owner, owner_of
from hyperpod_agent.slurm.models import Node

log = logging.getLogger(__name__)

# Owners whose node provisioning may drain: in service, or Slurm's own reason only
# (a machine that has not registered yet is "Not responding").
MAY_DRAIN = (Owner.NONE, Owner.SLURM)
MARKER = "first-use-drained"


class NodeSlurm(Protocol):
    """What joining needs of Slurm (``SlurmClient`` has it)."""

    def node(self, name: str) -> Node: ...

    def drain(self, node: str, reason: str) -> None: ...


class JoinDrained(Step):
    """The node drained under the reason that asks for its first check, once."""

    network = True  # slurmctld may not answer yet: retried with back-off

    def __init__(
        self,
        node: str,
        spare: bool,
        marker: Path,
        slurm: Callable[[], NodeSlurm],
        slurm_users: Collection[str] = ("slurm",),
    ) -> None:
        self.node, self.marker, self.slurm = node, marker, slurm
        self.reason = SPARE if spare else FIRST_USE
        self.slurm_users = tuple(slurm_users)
        self.name = f"join {node} drained ({self.reason})"

    def inspect(self, ctx: Context) -> Change | None:
        if self.marker.exists():
            return None
        return Change(f"drain {self.node} with reason {self.reason!r} (first provisioning)")

    def apply(self, ctx: Context) -> None:
        slurm = self.slurm()
        try:
            current = slurm.node(self.node)
            owner = owner_of(current, self.slurm_users)
            if owner in MAY_DRAIN:
                slurm.drain(self.node, self.reason)
                note = f"drained with reason {self.reason!r}"
            else:
                note = f"left as it is: drained by {owner.value} ({current.reason.strip()!r})"
        except SlurmError as exc:
            raise StepError(f"{self.node}: couldn't drain it for its first check: {exc}") from exc
        log.info("%s: %s", self.node, note)
        write_atomic(self.marker, f"{note}\n".encode(), 0o644)
