"""The head nodes' parameters: where clients find the controllers, and the store they share.

Several controller nodes run one controller each on one PostgreSQL database, one of them
leading by a lease (docs/controller.md "High availability"). SQLite cannot be shared, so
more than one controller node needs ``controller_store``; every head's controller.toml
is the same but its ``controller_id``, so the controllers listen on one port.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from hyperpod_agent.controller.config import HaConfig
from hyperpod_agent.controller.store.url import parse_store_url

# What hyperpod-controller.service hides from itself, and the setting that does.
HIDDEN_FROM_UNIT = {
    "/home": "ProtectHome=yes",
    "/root": "ProtectHome=yes",
    "/run/user": "ProtectHome=yes",
    "/tmp": "PrivateTmp=yes",
    "/var/tmp": "PrivateTmp=yes",
}
# controller.toml keys controller_store writes: controller_overrides must leave them alone.
STORE_KEYS = ("store", "store_password_file", "ha")


def check_controller_url(value: str) -> str:
    """``scheme://host:port`` and nothing more; the trailing slash dropped."""
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"expected http://HOST:PORT, got {value!r}")
    try:
        port = parsed.port
    except ValueError:
        raise ValueError(f"bad port in {value!r}") from None
    if port is None:
        raise ValueError(f"{value!r} needs an explicit port, e.g. http://head:8787")
    if parsed.path.strip("/") or parsed.query or parsed.fragment:
        raise ValueError(f"{value!r} must be scheme://host:port only")
    return value.rstrip("/")


ControllerUrl = Annotated[str, AfterValidator(check_controller_url)]


def url_port(url: str) -> int:
    """The port of a checked controller URL."""
    port = urllib.parse.urlsplit(url).port
    assert port is not None  # check_controller_url insists on one
    return port


class ControllerStore(BaseModel):
    """``controller_store``: the PostgreSQL database the controllers share."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(
        description="postgresql://user@host:port/database, without a password",
        json_schema_extra={"pattern": "^postgresql://"},
    )
    password_file: str | None = Field(
        default=None,
        description="absolute path of the password on every controller node, mode 0600 or "
        "0400; created by the site, checked by provisioning (under --prefix: inside it)",
        json_schema_extra={"pattern": "^/"},
    )
    lease_ttl_s: float | None = Field(
        default=None, gt=0, le=600, description="[ha] lease_ttl_s (several controller nodes)"
    )
    renew_every_s: float | None = Field(
        default=None, gt=0, le=300, description="[ha] renew_every_s (several controller nodes)"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        scheme = urllib.parse.urlsplit(value).scheme
        if scheme != "postgresql":
            # SQLite is one controller's own file: nothing another head node could share.
            why = ": SQLite is the default without controller_store" if scheme == "sqlite" else ""
            raise ValueError(f"must be postgresql://user@host:port/database{why}")
        try:
            parse_store_url(value)
        except ValueError as exc:
            # The same rules as controller.toml's store, in this file's words.
            raise ValueError(str(exc).replace("store_password_file", "password_file")) from None
        return value

    @field_validator("password_file")
    @classmethod
    def _password_file(cls, value: str | None) -> str | None:
        if value is None:
            return None
        path = PurePosixPath(value)
        if not path.is_absolute():
            raise ValueError(f"must be an absolute path, got {value!r}")
        for hidden, setting in HIDDEN_FROM_UNIT.items():
            if path.is_relative_to(hidden):
                raise ValueError(
                    f"{value} is hidden from hyperpod-controller.service ({setting}); put it "
                    "under /etc/hyperpod"
                )
        return value

    @model_validator(mode="after")
    def _timing(self) -> ControllerStore:
        defaults = HaConfig()
        ttl = self.lease_ttl_s if self.lease_ttl_s is not None else defaults.lease_ttl_s
        renew = self.renew_every_s if self.renew_every_s is not None else defaults.renew_every_s
        if ttl <= 2 * renew:
            raise ValueError(
                f"lease_ttl_s ({ttl:g}) must be more than twice renew_every_s ({renew:g})"
            )
        return self

    def ha_timing(self) -> dict[str, float]:
        """The lease settings the parameters name ([ha] defaults for the others)."""
        timing = {"lease_ttl_s": self.lease_ttl_s, "renew_every_s": self.renew_every_s}
        return {k: v for k, v in timing.items() if v is not None}


def controller_urls(url: str | None, urls: Sequence[str]) -> tuple[str, ...]:
    """Every controller URL from ``controller_url`` / ``controller_urls``, checked."""
    if url is not None and urls:
        raise ValueError("set controller_url or controller_urls, not both")
    if url is None and not urls:
        raise ValueError(
            "no controller URL: add controller_url, or controller_urls with one URL per "
            "controller node"
        )
    found = (url,) if url is not None else tuple(urls)
    for i, item in enumerate(found):
        if item in found[:i]:
            raise ValueError(f"controller_urls: {item} is listed twice")
    return found


def check_heads(
    nodes: Sequence[str],
    urls: Sequence[str],
    store: ControllerStore | None,
    overrides: Mapping[str, Any],
) -> None:
    """The rules tying controller nodes, their URLs and their store; ValueError naming
    the key."""
    many = len(nodes) > 1
    if many and store is None:
        raise ValueError(
            f"controller.nodes: {len(nodes)} controller nodes need controller_store (a "
            "PostgreSQL database they share; SQLite cannot be shared)"
        )
    if len(urls) != len(nodes):
        plural = "nodes need one URL each" if many else "node needs one URL"
        raise ValueError(f"controller_urls: {len(nodes)} controller {plural}, got {len(urls)}")
    if store is None:
        return
    if not many and store.ha_timing():
        key = next(iter(store.ha_timing()))
        raise ValueError(
            f"controller_store.{key}: applies only with more than one controller node (one "
            "node runs a single controller)"
        )
    for key in STORE_KEYS:
        if key in overrides:
            raise ValueError(f"controller_overrides.{key}: set by controller_store; remove it here")
