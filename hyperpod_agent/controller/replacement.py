"""Replacement in the loop (HyperPod semantics). Pure.

When an urgent fault hits a node running an auto-resume job, waiting for a reboot
would leave the requeued job short of a node (or send it back to a machine that just
failed). With a spare in the pool the node is replaced instead: the spare comes into
service, the faulty node is held for repair, and the job requeued in the same pass
lands on healthy nodes only.
"""

from __future__ import annotations

from collections.abc import Mapping

from hyperpod_agent.controller.autoresume import cap_of, required_nodes
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.reasons import SPARE
from hyperpod_agent.controller.snapshot import Snapshot
from hyperpod_agent.health import Action
from hyperpod_agent.slurm.models import Node

# Remedies a spare supersedes for a node under an auto-resume job: both leave the job
# short of a node for minutes, and both may put it back on a machine that just failed.
SUPERSEDED = (Action.RESET, Action.REBOOT)


class SparePool:
    """The responding spares of this pass; each can be promised to one replacement."""

    def __init__(self, nodes: Mapping[str, Node]) -> None:
        self._free = sorted(
            (n for n in nodes.values() if n.reason.strip() == SPARE and n.responding),
            key=lambda n: n.name,
        )

    def take(self, failed: Node) -> str | None:
        """Promise a spare sharing a partition with ``failed``; None when there is none."""
        parts = set(failed.partitions)
        for spare in self._free:
            if spare.name != failed.name and (not parts or parts & set(spare.partitions)):
                self._free.remove(spare)
                return spare.name
        return None


def resumable_job_on(name: str, snap: Snapshot, config: ControllerConfig) -> int | None:
    """The lowest id of a RUNNING job on ``name`` that auto-resume will requeue and
    that could run on a spare instead of ``name``."""
    ar = config.auto_resume
    if not ar.enabled:
        return None
    for job in sorted(snap.jobs, key=lambda j: j.job_id):
        if job.state.upper() != "RUNNING" or name not in job.nodes:
            continue
        if name in required_nodes(job):
            continue  # asked for this very node (-w): a spare cannot stand in for it
        cap = cap_of(job, snap, ar.default_attempts)
        tracked = snap.tracked.get(job.job_id)
        if cap is None or (
            tracked is not None and (tracked.state == "exhausted" or tracked.attempts >= cap)
        ):
            continue  # no requeue coming: a spare would not help this job
        return job.job_id
    return None
