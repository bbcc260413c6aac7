"""Who asks: the identity the Guard found for a request, and the route dependencies
that check it before any work (reports and heartbeats from the node itself, admin-only
routes)."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request

from hyperpod_agent.auth.config import NODE_NAME, AuthError, Identity, require_node
from hyperpod_agent.controller.api.guard import raw_json


def identity_of(request: Request) -> Identity:
    identity = getattr(request.state, "identity", None)
    if not isinstance(identity, Identity):
        raise AuthError("not authenticated", 401)
    return identity


async def node_itself(request: Request) -> None:
    """Reports and heartbeats: only the node the body names, checked on the raw JSON
    before the body (a report can be large) is validated: a caller that speaks for no
    node is refused at once, a node naming another node by a valid name too. A name
    that is no node name is the validation's to refuse (422), and the route checks the
    validated body again."""
    identity = identity_of(request)
    raw = raw_json(request)
    node = raw.get("node") if isinstance(raw, dict) else None
    named = isinstance(node, str) and NODE_NAME.match(node) is not None
    if identity.node is None or named:
        require_node(identity, node if isinstance(node, str) else "(none named)")


def admin_only(what: str) -> Any:
    """A route dependency: 403 unless the caller is an admin (``what``: for what)."""

    async def check(request: Request) -> None:
        if not identity_of(request).is_admin:
            raise AuthError(f"admin identity required {what}", 403)

    return Depends(check)
