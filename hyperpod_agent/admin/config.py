"""Where the admin CLI finds its controller and how it proves who it is.

Precedence, strongest first: command-line options, environment
(``HYPERPOD_CONTROLLER_URL``, ``HYPERPOD_MUNGE_SOCKET``), the config file
(``--config``, ``HYPERPOD_ADMIN_CONFIG``, ``/etc/hyperpod/admin.toml``, then the local
cluster's ``<dir>/etc/admin.toml`` when ``HYPERPOD_LOCAL_CLUSTER_DIR`` names it),
built-in defaults.

A config file says which controller to trust, with which CA and munge socket, so it is
read only if no one but root and the invoking user can change it (``check_trusted``).
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.errors import ConfigError

SYSTEM_CONFIG = Path("/etc/hyperpod/admin.toml")
ENV_URL = "HYPERPOD_CONTROLLER_URL"
ENV_SOCKET = "HYPERPOD_MUNGE_SOCKET"
ENV_CONFIG = "HYPERPOD_ADMIN_CONFIG"
ENV_LOCAL_DIR = "HYPERPOD_LOCAL_CLUSTER_DIR"


class ControllerSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # One URL, or several comma-separated (``urls`` in a file): the client tries them
    # in turn (controllers with [ha]).
    url: str = ""
    urls: list[str] = Field(default_factory=list)
    timeout_s: float = Field(default=10.0, gt=0, le=600)
    ca_file: Path | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ControllerSection:
        if self.url and self.urls:
            raise ValueError("set url or urls, not both")
        return self


class AdminConfig(BaseModel):
    """``admin.toml``: ``[controller]`` and ``[auth]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    controller: ControllerSection = Field(default_factory=ControllerSection)
    auth: AuthConfig = Field(default_factory=AuthConfig)


def candidate_files(env: Mapping[str, str]) -> list[Path]:
    """Config files looked at when none is named, in order.

    The local cluster's is one only when the user names its directory: a default
    directory under /var/tmp could have been made and filled by any local user.
    """
    local = env.get(ENV_LOCAL_DIR)
    return [SYSTEM_CONFIG] + ([Path(local) / "etc" / "admin.toml"] if local else [])


def check_trusted(path: Path) -> None:
    """Raise ConfigError unless only root or the invoking user can change ``path``.

    The file and every directory above it (as given and after symlinks) must be owned
    by root or by us and not writable by group or others; a world-writable directory
    with the sticky bit (``/tmp``) is fine, since others cannot replace what is in it.
    """
    me = os.geteuid()
    for chain in (path.absolute(), path.resolve()):
        for item in [chain, *chain.parents]:
            try:
                info = item.stat()
            except OSError as exc:
                raise ConfigError(f"{path}: {exc.strerror}") from exc
            what = "it" if item == chain else f"its directory {item}"
            if info.st_uid not in (0, me):
                raise ConfigError(
                    f"{path}: not trusted: {what} is owned by uid {info.st_uid}, not by root or you"
                )
            writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            sticky_dir = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
            if writable and not sticky_dir:
                raise ConfigError(
                    f"{path}: not trusted: {what} may be changed by group or others "
                    f"(mode {stat.S_IMODE(info.st_mode):04o})"
                )


def read_config(path: Path) -> AdminConfig:
    """Parse one admin.toml, if trusted; errors name the file and the key."""
    check_trusted(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    try:
        return AdminConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ConfigError(f"{path}: {key}: {err['msg']}") from exc


def resolve(
    *,
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
    env: Mapping[str, str] | None = None,
) -> AdminConfig:
    """The effective configuration for one command."""
    env = os.environ if env is None else env
    named = config_file or (Path(env[ENV_CONFIG]) if env.get(ENV_CONFIG) else None)
    if named is not None:
        config = read_config(named)
    else:
        found = next((p for p in candidate_files(env) if p.is_file()), None)
        config = read_config(found) if found else AdminConfig()
    controller = config.controller.model_copy(
        update={
            "url": url
            or env.get(ENV_URL)
            or config.controller.url
            or ",".join(config.controller.urls),
            "urls": [],
            **({"timeout_s": timeout} if timeout is not None else {}),
        }
    )
    socket = munge_socket or (Path(env[ENV_SOCKET]) if env.get(ENV_SOCKET) else None)
    auth = config.auth.model_copy(update={"munge_socket": socket}) if socket else config.auth
    if not controller.url:
        raise ConfigError(
            f"no controller URL: pass --url, set {ENV_URL}, or write [controller] url "
            f"in {SYSTEM_CONFIG}"
        )
    return AdminConfig(controller=controller, auth=auth)
