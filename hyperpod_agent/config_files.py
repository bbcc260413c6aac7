"""Reading config files: TOML parsed and validated against a pydantic model, with
errors that name the file, the first bad key and what was expected. Shared by the agent,
the deep-check suites and ``hyperpod config check``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from hyperpod_agent.errors import ConfigError


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


def load_model(path: Path, model: type[M]) -> M:
    """Load and validate ``path`` as ``model``; ConfigError with the key path."""
    data = load_toml(path)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(path), exc)) from None
