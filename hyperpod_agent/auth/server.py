"""Request authentication between agents, admins and the controller.

Three modes (see docs/security.md):

- ``munge`` (default): the client wraps a description of the request (method, path,
  sha256 of the body, time, claimed node) in a MUNGE credential; the controller
  decodes it with its own munged, which vouches for the caller's uid/gid and origin.
- ``token``: for sites without MUNGE. A cluster secret stays on the controller; each
  agent holds only ``HMAC(secret, "node:<name>")`` and so can speak only for its node;
  admins hold ``HMAC(secret, "admin")``. Requests carry an HMAC over the same fields.
- ``none``: no authentication at all, for tests and development only.

Both real modes reject stale requests (``max_skew_s``) and replays (a bounded cache).

The controller's verifier (``ServerAuth``) lives here; the settings, identity and error
types are in auth/config.py, the client's header maker in auth/client.py, and the
cryptographic building blocks and replay cache in auth/tokens.py. Every public name of
those is re-exported here, so ``from hyperpod_agent.auth import X`` keeps working.
"""

from __future__ import annotations

import grp
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import pwd
import re
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from hyperpod_agent.auth import munge as _munge
from hyperpod_agent.auth.config import (
    NODE_NAME,
    PAYLOAD_VERSION,
    AuthConfig,
    AuthError,
    Identity,
)
from hyperpod_agent.auth.tokens import (
    ReplayCache,
    body_digest,
    derive_key,
    normalize_path,
    read_secret,
    token_signature,
)
from hyperpod_agent.errors import ConfigError

__all__ = ["ServerAuth"]

log = logging.getLogger(__name__)

# What a client of ours sends; anything else is refused before it is interpreted
# (float() would take "nan", "inf", "1_0" and " 1"; compare_digest raises on non-ASCII).
TOKEN_TS = re.compile(r"^[0-9]{1,12}(\.[0-9]{1,9})?$")
TOKEN_NONCE = re.compile(r"^[0-9a-fA-F]{16,64}$")
TOKEN_SIG = re.compile(r"^[0-9a-fA-F]{64}$")
# No credential we make carries a time past this (year 5138); a larger one is garbage.
MAX_TIME = 1e11


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    for key, item in headers.items():
        if key.lower() == lowered:
            return item
    return None


def _fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in text.split():
        key, sep, value = part.partition("=")
        if not sep or not value or key in fields:
            raise AuthError(f"malformed Authorization field {part[:40]!r}")
        fields[key] = value
    return fields


def _addresses(host: str) -> set[str]:
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET)
    except OSError:
        return set()
    return {str(info[4][0]) for info in infos}


class ServerAuth:
    """Verifies requests on the controller."""

    def __init__(
        self,
        config: AuthConfig,
        *,
        node_address: Callable[[str], str | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.node_address = node_address
        self.clock = clock
        self.replay = ReplayCache(
            config.replay_cache_size, 2 * config.max_skew_s, config.replay_cache_per_identity
        )
        self._secret: bytes | None = None
        self._admin_gid: int | None = None
        if config.mode == "none":
            log.warning("authentication is disabled (auth.mode = none): anyone may act")
        elif config.mode == "token":
            if config.token_secret_file is None:
                raise ConfigError("auth.token_secret_file: the controller needs the secret")
            self._secret = read_secret(config.token_secret_file)
        if config.admin_group:
            self._admin_gid = _resolve_group(config.admin_group)

    def verify(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Identity:
        """Authenticate one request; raise AuthError (401/403/503) when refused."""
        value = _header(headers, "Authorization")
        if self.config.mode == "none":
            return self._verify_none(value)
        if not value:
            raise AuthError(f"missing Authorization header (auth mode {self.config.mode})")
        scheme, _, rest = value.strip().partition(" ")
        if self.config.mode == "munge":
            if scheme != "MUNGE":
                raise AuthError(f"expected a MUNGE credential, got scheme {scheme[:20]!r}")
            return self._verify_munge(method, path, rest.strip(), body)
        if scheme != "HPTOKEN":
            raise AuthError(f"expected an HPTOKEN credential, got scheme {scheme[:20]!r}")
        return self._verify_token(method, path, rest, body)

    def _verify_none(self, value: str | None) -> Identity:
        node = None
        if value and value.startswith("NONE"):
            node = _fields(value[4:]).get("node")
        return Identity(uid=0, gid=0, node=node, is_admin=True, method="none")

    def _verify_munge(self, method: str, path: str, cred: str, body: bytes) -> Identity:
        if not cred:
            raise AuthError("empty MUNGE credential")
        # Our own cache first: a munged shared by several nodes may tolerate replays.
        cache_key = "munge:" + hashlib.sha256(cred.encode()).hexdigest()
        if self.replay.seen(cache_key):
            raise AuthError("replayed credential")
        try:
            decoded = _munge.decode(cred, self.config.munge_socket)
        except _munge.MungeError as exc:
            if exc.is_credential_error:
                raise AuthError(f"MUNGE credential rejected: {exc}") from exc
            raise AuthError(f"cannot verify MUNGE credential: {exc}", 503) from exc
        claims = _binding(decoded.payload)
        stamped = self._check_binding(claims, method, path, body)
        self._check_fresh(float(decoded.encode_time), "MUNGE encode time")
        node = claims.get("n")
        if node is not None and (not isinstance(node, str) or not NODE_NAME.match(node)):
            raise AuthError("MUNGE payload names an invalid node")
        who = f"uid {decoded.uid}" + (f" (node {node})" if node else "")
        self._remember(cache_key, who, stamped)
        if node is not None:
            self._check_node_claim(decoded, node)
        return Identity(
            uid=decoded.uid,
            gid=decoded.gid,
            node=node,
            # A request made as a node (an agent) is scoped to that node even though
            # agents run as root: an agent never needs admin rights.
            is_admin=node is None and self._is_admin(decoded.uid, decoded.gid),
            method="munge",
        )

    def _remember(self, key: str, identity: str, stamped: float) -> None:
        """Record an accepted credential of ``identity`` (its replay-cache share)."""
        refused = self.replay.check_and_add(key, identity, stamped, self.clock())
        if refused:
            # A 429 names who is over its share: the log of refusals is keyed by address.
            why = f"{identity}: {refused.message}" if refused.status == 429 else refused.message
            raise AuthError(why, refused.status)

    def _check_binding(self, claims: dict[str, Any], method: str, path: str, body: bytes) -> float:
        if claims.get("m") != method.upper():
            made_for = claims.get("m")
            shown = repr(made_for)[:20] if isinstance(made_for, str) else "another method"
            raise AuthError(f"credential was made for {shown}, not {method.upper()}")
        if claims.get("p") != normalize_path(path):
            raise AuthError(f"credential was made for another path, not {normalize_path(path)}")
        if claims.get("b") != body_digest(body):
            raise AuthError("credential does not match the request body")
        stamped = claims.get("t")
        if not isinstance(stamped, int | float) or isinstance(stamped, bool):
            raise AuthError("credential carries no timestamp")
        self._check_fresh(stamped, "timestamp")
        return float(stamped)

    def _check_fresh(self, stamped: float, what: str) -> None:
        # NaN compares false with everything: without this it would pass as fresh.
        if not math.isfinite(stamped) or not 0 <= stamped <= MAX_TIME:
            raise AuthError(f"credential {what} is not a plausible time")
        off = stamped - self.clock()
        if abs(off) > self.config.max_skew_s:
            raise AuthError(
                f"stale credential: {what} is {off:+.0f} s off the controller clock "
                f"(max_skew_s = {self.config.max_skew_s:g})"
            )

    def _check_node_claim(self, decoded: _munge.Decoded, node: str) -> None:
        if decoded.uid != 0:
            raise AuthError(f"uid {decoded.uid} may not speak for node {node}: only root may", 403)
        if not self.config.check_origin or self.node_address is None:
            return
        expected = self.node_address(node)
        if not expected:
            raise AuthError(f"unknown node {node}: no address to check the origin against", 403)
        if decoded.addr not in _addresses(expected):
            raise AuthError(
                f"credential for node {node} comes from {decoded.addr}, not from {expected}", 403
            )

    def _is_admin(self, uid: int, gid: int) -> bool:
        if uid == 0:
            return True
        if self._admin_gid is None:
            return False
        if gid == self._admin_gid:
            return True
        try:
            members = grp.getgrgid(self._admin_gid).gr_mem
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            return False
        return user in members

    def _verify_token(self, method: str, path: str, rest: str, body: bytes) -> Identity:
        assert self._secret is not None
        fields = _fields(rest)
        missing = {"ts", "nonce", "sig"} - fields.keys()
        if missing:
            raise AuthError(f"HPTOKEN credential lacks {', '.join(sorted(missing))}")
        extra = fields.keys() - {"ts", "nonce", "sig", "node", "role"}
        if extra:
            raise AuthError(f"HPTOKEN credential has unknown field {sorted(extra)[0]!r}")
        node = fields.get("node")
        if node is not None and fields.get("role") is not None:
            raise AuthError("HPTOKEN credential names both a node and a role")
        if node is not None:
            if not NODE_NAME.match(node):
                raise AuthError("HPTOKEN credential names an invalid node")
            subject = "node:" + node
        elif fields.get("role") == "admin":
            subject = "admin"
        else:
            raise AuthError("HPTOKEN credential names neither a node nor role=admin")
        if not TOKEN_TS.match(fields["ts"]):
            raise AuthError("HPTOKEN timestamp is not a number of seconds")
        if not TOKEN_NONCE.match(fields["nonce"]):
            raise AuthError("HPTOKEN nonce is not 16 to 64 hex digits")
        if not TOKEN_SIG.match(fields["sig"]):
            raise AuthError("HPTOKEN signature is not 64 hex digits")
        stamped = float(fields["ts"])
        expected = token_signature(
            derive_key(self._secret, subject),
            subject,
            method,
            path,
            fields["ts"],
            fields["nonce"],
            body,
        )
        if not hmac.compare_digest(expected, fields["sig"].lower()):
            raise AuthError(f"bad HPTOKEN signature for {subject}")
        self._check_fresh(stamped, "timestamp")
        who = f"token of node {node}" if node is not None else "admin token"
        self._remember(f"token:{subject}:{fields['nonce'].lower()}", who, stamped)
        if node is not None:
            return Identity(uid=-1, gid=-1, node=node, is_admin=False, method="token")
        return Identity(uid=-1, gid=-1, node=None, is_admin=True, method="token")


def _binding(payload: bytes) -> dict[str, Any]:
    """The request binding a MUNGE credential carries; AuthError if it is anything else.

    Anyone in the realm can wrap any payload, so parse it as hostile: no NaN or
    Infinity, no nesting deep enough to exhaust the stack.
    """
    try:
        claims: Any = json.loads(payload, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise AuthError("MUNGE payload is not a request binding") from exc
    version = claims.get("v") if isinstance(claims, dict) else None
    if type(version) is not int or version != PAYLOAD_VERSION:
        raise AuthError("MUNGE payload is not a request binding")
    return dict(claims)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _resolve_group(name: str) -> int:
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError as exc:
        raise ConfigError(f"auth.admin_group: no group named {name!r}") from exc
