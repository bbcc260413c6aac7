"""Agent -> controller reporting (placeholder until implemented)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ReporterConfig(BaseModel):
    """``[controller]`` section of agent.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = ""
