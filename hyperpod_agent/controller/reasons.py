"""Slurm reason strings: the ones we write, and the admin requests we honour.

Reasons we write read ``hyperpod:<verb> <component> <code> <message>``; owning a
reason is what allows us to resume, reboot or replace a node (DESIGN §3). Admin
requests follow HyperPod's ``Action:Replace`` / ``Action:Reboot`` form.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

PREFIX = "hyperpod:"
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


def parse_admin_request(reason: str) -> Verb | None:
    """``Action:Replace`` / `` action : reboot`` (any case, any spacing) -> the verb."""
    match = _ADMIN.match(reason)
    if match is None:
        return None
    return Verb(match.group(1).lower())
