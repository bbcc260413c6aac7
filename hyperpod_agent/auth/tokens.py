"""Building blocks of request authentication: body digests, derived keys, token
signatures and the replay cache. Policy (who may do what) lives in auth/server.py."""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

from hyperpod_agent.errors import ConfigError

MIN_SECRET_BYTES = 32


def body_digest(body: bytes) -> str:
    """Hex sha256 of a request body, as bound into credentials."""
    return hashlib.sha256(body).hexdigest()


def normalize_path(path: str) -> str:
    """The part of a request target credentials bind: the path without its query."""
    return path.split("?", 1)[0] or "/"


def derive_key(secret: bytes, subject: str) -> bytes:
    """Token mode: the key of ``subject`` ("node:<name>" or "admin")."""
    return hmac.new(secret, subject.encode(), hashlib.sha256).digest()


def read_secret(path: Path) -> bytes:
    """Read a cluster secret file; raise ConfigError when missing or too short."""
    try:
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"auth.token_secret_file {path}: {exc.strerror}") from exc
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"auth.token_secret_file {path}: secret is {len(secret)} bytes, "
            f"expected at least {MIN_SECRET_BYTES}"
        )
    return secret


def read_key(path: Path) -> bytes:
    """Read a derived key file (64 hex digits); raise ConfigError otherwise."""
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"auth.token_key_file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"auth.token_key_file {path}: not text") from exc
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        raise ConfigError(f"auth.token_key_file {path}: expected 64 hex digits")
    return bytes.fromhex(text)


def token_signature(
    key: bytes, subject: str, method: str, path: str, ts: str, nonce: str, body: bytes
) -> str:
    """Token mode: hex HMAC binding a request to the key holder."""
    message = "\n".join(
        [subject, method.upper(), normalize_path(path), ts, nonce, body_digest(body)]
    )
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


class Refusal(NamedTuple):
    """Why the replay cache refuses a credential: 401 (replayed, too old) or 429."""

    status: int
    message: str


class ReplayCache:
    """Remembers accepted credentials for ``window_s`` of *receive* time, bounded.

    Entries expire by the controller's own clock, never by the stamp a client chose.
    Each identity (a node, a uid, the admin token) may hold at most ``per_identity``
    entries: past that its requests are refused with 429 until its own entries expire,
    so one identity's flood never pushes out another's. Only when the whole cache is
    full (many identities flooding at once) is an entry dropped early: the oldest of
    the identity holding the most. That identity's floor rises to the dropped stamp
    and anything it stamps at or before the floor is refused from then on, so a
    dropped credential can never be replayed, and only the identity that filled the
    cache pays for it.
    """

    def __init__(self, size: int, window_s: float, per_identity: int | None = None):
        self.size = size
        self.window_s = window_s
        self.per_identity = min(size, per_identity or size)
        # credential key -> (identity, received at), in arrival order (for expiry)
        self._arrival: OrderedDict[str, tuple[str, float]] = OrderedDict()
        # identity -> credential key -> stamp, in arrival order (for eviction)
        self._by_identity: dict[str, OrderedDict[str, float]] = {}
        self._floors: dict[str, float] = {}
        # The API may verify requests on several threads at once.
        self._lock = threading.Lock()

    def seen(self, key: str) -> bool:
        """True when ``key`` was accepted within the window."""
        with self._lock:
            return key in self._arrival

    def floor(self, identity: str) -> float | None:
        """The stamp at or before which ``identity``'s credentials are refused, if any."""
        with self._lock:
            return self._floors.get(identity)

    def check_and_add(self, key: str, identity: str, stamped: float, now: float) -> Refusal | None:
        """Record ``key`` of ``identity``; return why it is refused, or None when fresh."""
        with self._lock:
            self._expire(now)
            if key in self._arrival:
                return Refusal(401, "replayed credential")
            floor = self._floors.get(identity)
            if floor is not None and stamped <= floor:
                return Refusal(401, "credential older than the replay cache can vouch for")
            mine = self._by_identity.get(identity)
            if mine is not None and len(mine) >= self.per_identity:
                return Refusal(
                    429,
                    f"too many requests: at most {self.per_identity} per identity "
                    f"within {self.window_s:g} s; retry later",
                )
            if len(self._arrival) >= self.size:
                self._evict()
            self._arrival[key] = (identity, now)
            self._by_identity.setdefault(identity, OrderedDict())[key] = stamped
            return None

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        while self._arrival:
            key, (identity, received) = next(iter(self._arrival.items()))
            if received >= horizon:
                break
            del self._arrival[key]
            self._forget(identity, key)
        # A floor below the window refuses nothing freshness would let through.
        for identity in [i for i, f in self._floors.items() if f < horizon]:
            del self._floors[identity]

    def _evict(self) -> None:
        victim = max(self._by_identity, key=lambda i: len(self._by_identity[i]))
        key, stamped = next(iter(self._by_identity[victim].items()))
        del self._arrival[key]
        self._forget(victim, key)
        self._floors[victim] = max(self._floors.get(victim, stamped), stamped)

    def _forget(self, identity: str, key: str) -> None:
        mine = self._by_identity[identity]
        del mine[key]
        if not mine:
            del self._by_identity[identity]
