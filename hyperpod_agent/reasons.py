"""Slurm reason strings: the ones we write, and the admin requests we honour.

Reasons we write read ``hyperpod:<verb> <component> <code> <message>``; owning a
reason is what allows us to resume, reboot or replace a node (DESIGN §3). Admin
requests follow HyperPod's ``Action:Replace`` / ``Action:Reboot`` form.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection
from dataclasses import dataclass

from hyperpod_agent.slurm.models import Node

PREFIX = "hyperpod:"
# The reasons slurmctld writes itself (node_mgr.c, ping_nodes.c), always as SlurmUser.
# Matched whole and case-sensitively: "Not responding to IPMI - RMA 1234" is a human's.
SLURM_REASONS = frozenset({"Not responding", "Node unexpectedly rebooted", "reboot timed out"})
SPARE = "hyperpod:spare"
# Slurm keeps reasons as given, but long ones clutter sinfo; keep them readable.
MAX_REASON = 200


class Verb(enum.StrEnum):
    """What a reason says we did (or are doing) to the node."""

    DRAIN = "drain"  # out of service until healthy again; resumed by us
    RESET = "reset"  # drained so the node-local agent can reset a GPU while idle
    REBOOT = "reboot"  # drained for ``scontrol reboot``
    REPLACE = "replace"  # replaced; held for repair, never auto-resumed
    HOLD = "hold"  # lemon or admin hold: never auto-resumed
    SPARE = "spare"  # waiting in the spare pool
    # out until it passed a deep check before it takes work: a node new from provisioning,
    # back from a replacement, or resumed by an admin; resumed by us (without a deep-check
    # suite, once healthy)
    CHECK = "check"


@dataclass(frozen=True)
class OwnedReason:
    verb: Verb
    component: str
    code: str
    message: str


_WS = re.compile(r"[\s\x00-\x1f\x7f]+")
_TOKEN = re.compile(r"[^A-Za-z0-9._/:@+-]")
_ADMIN = re.compile(r"^\s*action\s*:\s*(replace|reboot)\s*$", re.IGNORECASE)


def _token(value: str) -> str:
    cleaned = _TOKEN.sub("_", value.strip())
    return cleaned or "-"


def format_reason(verb: Verb, component: str = "-", code: str = "-", message: str = "") -> str:
    """The canonical reason for ``verb``; whitespace collapsed, length bounded."""
    if verb is Verb.SPARE:
        return SPARE
    text = f"{PREFIX}{verb.value} {_token(component)} {_token(code)}"
    msg = _WS.sub(" ", message).strip()
    if msg:
        text = f"{text} {msg}"
    return text[:MAX_REASON]


def owned(reason: str) -> bool:
    """True when the reason was written by us (starts with ``hyperpod:``)."""
    return reason.strip().lower().startswith(PREFIX)


def parse_reason(reason: str) -> OwnedReason | None:
    """Parse a reason we wrote; None for anybody else's or an unknown verb."""
    text = reason.strip()
    if not owned(text):
        return None
    parts = text[len(PREFIX) :].split(" ", 3)
    try:
        verb = Verb(parts[0].lower())
    except ValueError:
        return None
    component = parts[1] if len(parts) > 1 else "-"
    code = parts[2] if len(parts) > 2 else "-"
    message = parts[3] if len(parts) > 3 else ""
    return OwnedReason(verb, component, code, message)


# What the lifecycle scripts drain a newly provisioned worker with: the controller
# checks it (docs/deep-checks.md, "Gates") and then resumes it.
FIRST_USE = format_reason(Verb.CHECK, "provision", "new", "deep check before first use")


def parse_admin_request(reason: str) -> Verb | None:
    """``Action:Replace`` / `` action : reboot`` (any case, any spacing) -> the verb."""
    match = _ADMIN.match(reason)
    if match is None:
        return None
    return Verb(match.group(1).lower())


class Owner(enum.StrEnum):
    """Whose a node is, as its Slurm reason says (DESIGN §3)."""

    NONE = "none"  # in service: nobody's to decide about
    US = "us"  # a reason we wrote
    SPARE = "spare"  # waiting in our spare pool
    REQUEST = "request"  # ``Action:Replace`` / ``Action:Reboot``: an admin hands it to us
    SLURM = "slurm"  # Slurm's own reason for a dead or rebooted node
    OTHER = "other"  # a human's or another tool's: never touched


def owner_of(node: Node, slurm_users: Collection[str]) -> Owner:
    """The one owner check: who may act on ``node`` now.

    Decided from the node's current reason and the user who set it. Our reasons are
    ours by their prefix; Slurm's only when the text is exactly one Slurm writes and
    its user is the SlurmUser (or not known). Everything else is hands off.
    """
    if not node.drained:
        return Owner.NONE
    reason = node.reason.strip()
    if reason == SPARE:
        return Owner.SPARE
    if parse_admin_request(reason) is not None:
        return Owner.REQUEST
    if parse_reason(reason) is not None:
        return Owner.US
    if reason in SLURM_REASONS and (not node.reason_user or node.reason_user in slurm_users):
        return Owner.SLURM
    return Owner.OTHER
