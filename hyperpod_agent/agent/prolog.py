"""``hyperpod health-check --prolog``: keep a new job off a node with an urgent fault.

Slurm runs the Prolog before a job's first step on each node; a non-zero exit requeues
the job (provisioning adds ``nohold_on_prolog_fail``, so it is not held) and drains the
node with the reason "Prolog error", which nobody owns. So the gate first drains the
node with our reason, as the agent's self-drain would: Slurm's own drain then finds the
node drained and leaves the reason alone, and the controller owns what follows.

The gate acts only where the agent's self-drain would (DESIGN §1): an urgent fault the
verdict confirmed, a node in service or holding only Slurm's own reason. Anything it
cannot read (no cache, a stale one, Slurm not answering) lets the job start: a dead
agent or a probe's bug must not stop every job on the cluster. In observe mode it says
what it would have done and lets the job start.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_START, EXIT_REFUSE = 0, 1


@dataclass(frozen=True)
class GateSettings:
    node: str | None
    observe: bool
    slurm_conf: Path | None
    slurm_user: str


def read_gate_settings(config: Path | None) -> GateSettings:
    """What the gate needs from agent.toml; an unreadable file means the defaults."""
    data: dict[str, Any] = {}
    if config is not None:
        try:
            with open(config, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError):
            data = {}
    controller = data.get("controller", {})
    controller = controller if isinstance(controller, dict) else {}
    conf = data.get("slurm_conf") or controller.get("slurm_conf")
    return GateSettings(
        node=os.environ.get("SLURMD_NODENAME") or data.get("node_name"),
        observe=controller.get("mode") == "observe",
        slurm_conf=Path(str(conf)) if conf else None,
        slurm_user=str(controller.get("slurm_user", "slurm")),
    )


def urgent_fault(cache: dict[str, Any]) -> str | None:
    """The fault's message when the cached verdict is an urgent fault, else None."""
    if cache.get("verdict") != "faulty" or not cache.get("urgent"):
        return None
    return str(cache.get("message") or "urgent fault")


def gate(cache: dict[str, Any], settings: GateSettings) -> tuple[int, str]:
    """Exit status and one line for the Prolog, given a fresh health cache."""
    message = urgent_fault(cache)
    if message is None:
        return EXIT_START, "no urgent fault: the job may start"
    if settings.node is None:
        return EXIT_START, f"urgent fault ({message}) but no node name to drain: job starts"
    if settings.observe:
        return EXIT_START, f"{settings.node}: would refuse the job and drain: {message}"
    # Imported here: health-check's plain path stays free of the Slurm client.
    from hyperpod_agent.errors import HyperpodError
    from hyperpod_agent.reasons import Owner, Verb, format_reason, owner_of
    from hyperpod_agent.slurm.client import SlurmClient

    slurm = SlurmClient(slurm_conf=settings.slurm_conf, timeout=5)
    try:
        node = slurm.node(settings.node)
        if node.drained:
            return EXIT_REFUSE, f"{settings.node}: already out of service: {message}"
        if owner_of(node, (settings.slurm_user,)) not in (Owner.NONE, Owner.SLURM):
            return EXIT_START, f"{settings.node}: another owner's reason stands: job starts"
        slurm.drain(settings.node, format_reason(Verb.DRAIN, "prolog", "urgent", message))
    except HyperpodError as exc:
        return EXIT_START, f"{settings.node}: cannot drain ({exc}): job starts"
    return EXIT_REFUSE, f"{settings.node}: drained, job refused: {message}"
