"""Reading config files: TOML parsed and validated against a pydantic model, with
errors that name the file, the first bad key and what was expected. Shared by the agent,
the deep-check suites and ``hyperpod config check``."""

from __future__ import annotations

import copy
import json
import logging
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from hyperpod_agent.errors import ConfigError

log = logging.getLogger(__name__)


def _describe(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = str(err["msg"]).split(", unable to")[0].removeprefix("Value error, ")
    value = err.get("input")
    if err["type"] == "missing" or isinstance(value, dict | list):
        return f"{where}: {msg}"
    return f"{where}: {msg}, got {json.dumps(value, default=str)}"


def format_validation_error(source: str, exc: ValidationError) -> str:
    """One line: the source, the first bad key path, what was expected."""
    errors = exc.errors()
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {_describe(errors[0])}{more}"


def load_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; ConfigError naming the file on any failure."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


M = TypeVar("M", bound=BaseModel)


def load_model(path: Path, model: type[M], *, newer_keys: bool = False) -> M:
    """Load and validate ``path`` as ``model``; ConfigError with the key path.

    ``newer_keys``: a daemon's own config during a rollout may hold keys of the next
    release (provisioning updated before the package): they are ignored with a
    warning each rather than a crash loop. Only when every error is such a key; a
    wrong value is still an error. ``hyperpod config validate`` stays strict."""
    return validate_model(load_toml(path), model, str(path), newer_keys=newer_keys)


def validate_model(
    data: dict[str, Any], model: type[M], source: str, *, newer_keys: bool = False
) -> M:
    """``load_model`` on already parsed data."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        kept = without_newer_keys(data, exc, source) if newer_keys else None
        if kept is None:
            raise ConfigError(format_validation_error(source, exc)) from None
    try:
        return model.model_validate(kept)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None


def without_newer_keys(
    data: dict[str, Any], exc: ValidationError, source: str
) -> dict[str, Any] | None:
    """``data`` without the keys ``exc`` found unknown, each logged as a warning; None
    when there are none (the error is another)."""
    unknown = [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]
    if not unknown:
        return None
    kept = copy.deepcopy(data)
    for loc in unknown:
        _drop(kept, loc)
        log.warning(
            "%s: %s: not a key of this release, ignored (a newer config? "
            "`hyperpod config validate` reports it)",
            source,
            ".".join(str(p) for p in loc),
        )
    return kept


def _drop(data: Any, loc: tuple[Any, ...]) -> None:
    for step in loc[:-1]:
        data = data[step]
    data.pop(loc[-1], None)
