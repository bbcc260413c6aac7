"""What request authentication speaks in: the ``[auth]`` settings, the caller's identity,
the error it raises, and the checks made on an identity (admin? may it speak for a node?).

Kept apart from auth/server.py (the controller's verifier) and auth/client.py (the header maker)
so that both sides, and the configs that embed ``AuthConfig``, share one definition.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hyperpod_agent.errors import HyperpodError

# Both ends of the wire format: the client stamps the version, the server checks it.
PAYLOAD_VERSION = 1
NODE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class AuthError(HyperpodError):
    """A request could not be authenticated (401) or is not allowed (403).

    503 means the controller could not check a credential (its munged is down).
    """

    def __init__(self, message: str, status: int = 401):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Identity:
    uid: int  # -1 when the mode has no Unix identity (token)
    gid: int
    node: str | None  # the node this caller may speak for, None for a non-node caller
    is_admin: bool
    method: str


class AuthConfig(BaseModel):
    """``[auth]`` section shared by the agent, the controller and the admin CLI."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["munge", "token", "none"] = "munge"
    munge_socket: Path | None = Field(
        default=None, description="munged socket; None = libmunge's default"
    )
    max_skew_s: float = Field(default=60.0, gt=0, le=3600)
    replay_cache_size: int = Field(default=100_000, ge=16, le=10_000_000)
    replay_cache_per_identity: int = Field(
        default=10_000,
        ge=16,
        le=10_000_000,
        description="requests one identity may make within 2 x max_skew_s (429 beyond); "
        "at most replay_cache_size",
    )
    admin_group: str = Field(
        default="", description="group name or gid whose members are admins (root always is)"
    )
    check_origin: bool = Field(
        default=True, description="munge: a node claim must come from the node's address"
    )
    token_secret_file: Path | None = Field(
        default=None, description="token: cluster secret (controller; clients may derive)"
    )
    token_key_file: Path | None = Field(
        default=None, description="token: this client's derived key, hex"
    )

    @model_validator(mode="after")
    def _token_needs_key(self) -> AuthConfig:
        if self.mode == "token" and not (self.token_secret_file or self.token_key_file):
            raise ValueError("mode 'token' needs token_secret_file or token_key_file")
        return self


def require_admin(identity: Identity) -> None:
    """Raise a 403 AuthError unless ``identity`` is an admin."""
    if not identity.is_admin:
        raise AuthError(f"{describe(identity)} is not an admin", 403)


def require_node(identity: Identity, node: str) -> None:
    """Raise a 403 AuthError unless ``identity`` may speak for ``node``."""
    if identity.node != node:
        who = describe(identity)
        raise AuthError(f"{who} may not report for node {node}", 403)


def describe(identity: Identity) -> str:
    """A short description of a caller for messages and logs."""
    if identity.method == "token":
        return f"token of node {identity.node}" if identity.node else "admin token"
    if identity.node:
        return f"uid {identity.uid} (node {identity.node})"
    return f"uid {identity.uid}"
