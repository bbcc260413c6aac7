"""The client side of request authentication: the Authorization header an agent or an
admin sends to the controller, in the configured mode (see auth/server.py for the modes)."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable

from hyperpod_agent.auth import munge as _munge
from hyperpod_agent.auth.config import NODE_NAME, PAYLOAD_VERSION, AuthConfig, AuthError
from hyperpod_agent.auth.tokens import (
    body_digest,
    derive_key,
    normalize_path,
    read_key,
    read_secret,
    token_signature,
)
from hyperpod_agent.errors import ConfigError


class ClientAuth:
    """Makes the Authorization header for requests to the controller.

    ``node`` is the node this client speaks for (an agent); None for admins.
    """

    def __init__(
        self,
        config: AuthConfig,
        node: str | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.node = node
        self.clock = clock
        self._key: bytes | None = None
        if node is not None and not NODE_NAME.match(node):
            raise ConfigError(f"invalid node name {node!r}")
        if config.mode == "token":
            self._key = self._load_key()

    def _load_key(self) -> bytes:
        if self.config.token_key_file is not None:
            return read_key(self.config.token_key_file)
        assert self.config.token_secret_file is not None
        secret = read_secret(self.config.token_secret_file)
        return derive_key(secret, self._subject())

    def _subject(self) -> str:
        return "node:" + self.node if self.node else "admin"

    def headers(self, method: str, path: str, body: bytes) -> dict[str, str]:
        """Headers that authenticate one request (raise AuthError if none can be made)."""
        if self.config.mode == "none":
            return {"Authorization": f"NONE node={self.node}" if self.node else "NONE"}
        if self.config.mode == "munge":
            claims = {
                "v": PAYLOAD_VERSION,
                "m": method.upper(),
                "p": normalize_path(path),
                "b": body_digest(body),
                "t": round(self.clock(), 3),
                "n": self.node,
            }
            payload = json.dumps(claims, separators=(",", ":")).encode()
            try:
                cred = _munge.encode(payload, self.config.munge_socket)
            except _munge.MungeError as exc:
                raise AuthError(f"cannot create a MUNGE credential: {exc}", 0) from exc
            return {"Authorization": "MUNGE " + cred}
        assert self._key is not None
        ts = f"{self.clock():.3f}"
        nonce = secrets.token_hex(16)
        subject = self._subject()
        sig = token_signature(self._key, subject, method, path, ts, nonce, body)
        who = f"node={self.node}" if self.node else "role=admin"
        return {"Authorization": f"HPTOKEN {who} ts={ts} nonce={nonce} sig={sig}"}
