"""Reading ``provisioning_parameters.json`` and ``resource_config.json``: JSON first,
then the models (models.py), then the agent and controller overrides rendered on a
sample node and checked by each component's own config model (render.py), so every
problem is reported before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hyperpod_agent.provision.models import (
    ProvisionError,
    ProvisioningParameters,
    ResourceConfig,
    describe_errors,
)
from hyperpod_agent.provision.render import check_overrides


def parse_json(text: str, source: str) -> Any:
    """Parse JSON text; ProvisionError with line and column on failure."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProvisionError(
            [f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]
        ) from None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProvisionError([f"{path}: no such file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProvisionError([f"{path}: cannot read: {exc}"]) from None


def parse_parameters(data: Any, source: str) -> ProvisioningParameters:
    """Validate parsed JSON, then the agent/controller overrides; all problems listed."""
    try:
        params = ProvisioningParameters.model_validate(data)
    except ValidationError as exc:
        raise ProvisionError(describe_errors(source, exc)) from None
    problems = check_overrides(params, source)
    if problems:
        raise ProvisionError(problems)
    return params


def load_parameters(path: Path) -> ProvisioningParameters:
    """Read and validate provisioning_parameters.json."""
    return parse_parameters(parse_json(_read(path), str(path)), str(path))


def load_resource_config(path: Path) -> ResourceConfig:
    """Read and validate resource_config.json."""
    try:
        return ResourceConfig.model_validate(parse_json(_read(path), str(path)))
    except ValidationError as exc:
        raise ProvisionError(describe_errors(str(path), exc)) from None
