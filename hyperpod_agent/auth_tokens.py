"""Building blocks of request authentication: body digests, derived keys, token
signatures and the replay cache. Policy (who may do what) lives in auth.py."""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
from collections import OrderedDict
from pathlib import Path

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


class ReplayCache:
    """Remembers credentials seen within the skew window, bounded in size.

    When the cache is full, the oldest entry is dropped and the time floor rises to its
    timestamp: anything stamped at or before the floor is refused from then on, so a
    dropped entry can never be replayed.
    """

    def __init__(self, size: int, window_s: float):
        self.size = size
        self.window_s = window_s
        self.floor = 0.0
        self._seen: OrderedDict[str, float] = OrderedDict()
        # The API may verify requests on several threads at once.
        self._lock = threading.Lock()

    def seen(self, key: str) -> bool:
        """True when ``key`` was accepted within the window."""
        with self._lock:
            return key in self._seen

    def check_and_add(self, key: str, stamped: float, now: float) -> str | None:
        """Record ``key``; return why it is refused, or None when it is fresh."""
        with self._lock:
            return self._check_and_add(key, stamped, now)

    def _check_and_add(self, key: str, stamped: float, now: float) -> str | None:
        while self._seen:
            oldest_key, oldest = next(iter(self._seen.items()))
            if oldest >= now - self.window_s:
                break
            del self._seen[oldest_key]
        if key in self._seen:
            return "replayed credential"
        if stamped <= self.floor:
            return "credential older than the replay cache can vouch for"
        if len(self._seen) >= self.size:
            _, dropped = self._seen.popitem(last=False)
            self.floor = max(self.floor, dropped)
        # Ordered by arrival, which tracks the stamp closely enough for expiry.
        self._seen[key] = stamped
        return None
