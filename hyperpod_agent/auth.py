"""Request authentication between agents, admins and the controller (placeholder)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from hyperpod_agent.errors import HyperpodError


class AuthError(HyperpodError):
    """A request could not be authenticated (401) or is not allowed (403)."""

    def __init__(self, message: str, status: int = 401):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    node: str | None  # the node this caller may speak for, None for a non-node caller
    is_admin: bool
    method: str


class AuthConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["munge", "token", "none"] = "munge"


class ServerAuth:
    def __init__(self, config: AuthConfig) -> None:
        self.config = config

    def verify(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Identity:
        return Identity(uid=0, gid=0, node=None, is_admin=True, method="none")


class ClientAuth:
    def __init__(self, config: AuthConfig, node: str | None = None) -> None:
        self.config = config
        self.node = node

    def headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        return {}
