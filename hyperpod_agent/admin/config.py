"""Where the admin CLI finds its controller and how it proves who it is.

Precedence, strongest first: command-line options, environment
(``HYPERPOD_CONTROLLER_URL``, ``HYPERPOD_MUNGE_SOCKET``), the config file
(``--config``, ``HYPERPOD_ADMIN_CONFIG``, ``/etc/hyperpod/admin.toml``, then the local
cluster's ``<dir>/etc/admin.toml``), built-in defaults.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hyperpod_agent.auth import AuthConfig
from hyperpod_agent.errors import ConfigError

SYSTEM_CONFIG = Path("/etc/hyperpod/admin.toml")
LOCAL_CLUSTER_DIR = Path("/var/tmp/hyperpod-local")
ENV_URL = "HYPERPOD_CONTROLLER_URL"
ENV_SOCKET = "HYPERPOD_MUNGE_SOCKET"
ENV_CONFIG = "HYPERPOD_ADMIN_CONFIG"
ENV_LOCAL_DIR = "HYPERPOD_LOCAL_CLUSTER_DIR"


class ControllerSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = ""
    timeout_s: float = Field(default=10.0, gt=0, le=600)
    ca_file: Path | None = None


class AdminConfig(BaseModel):
    """``admin.toml``: ``[controller]`` and ``[auth]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    controller: ControllerSection = Field(default_factory=ControllerSection)
    auth: AuthConfig = Field(default_factory=AuthConfig)


def candidate_files(env: Mapping[str, str]) -> list[Path]:
    """Config files looked at when none is named, in order."""
    local = Path(env.get(ENV_LOCAL_DIR) or LOCAL_CLUSTER_DIR)
    return [SYSTEM_CONFIG, local / "etc" / "admin.toml"]


def read_config(path: Path) -> AdminConfig:
    """Parse one admin.toml; errors name the file and the key."""
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
            "url": url or env.get(ENV_URL) or config.controller.url,
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
