"""What agents, the CLI and the controller send each other, across one release of
difference (docs/upgrades.md).

A rollout updates nodes one by one, so a controller hears agents one release older and
newer than itself. A message from a newer peer may carry fields this release does not
know: they are ignored, never a 422 that would blind the controller to that node, and
counted (``hyperpod_api_unknown_fields_total{model}``) and logged once per model and
field, so an admin sees a version skew. A field this release needs is never new: a
field is added as optional, with a default that means what the older release did.

``API_VERSION`` grows when a message changes meaning. Every request names its sender's
release in ``User-Agent: hyperpod/<version>``; the controller keeps each agent's.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

log = logging.getLogger(__name__)

API_VERSION = 1
USER_AGENT = re.compile(r"\bhyperpod/([0-9A-Za-z.+_-]{1,32})\b")

# Called with (model, field) for each unknown field: the controller counts them.
_hooks: list[Callable[[str, str], None]] = []
_logged: set[tuple[str, str]] = set()
_lock = threading.Lock()
_MAX_LOGGED = 256  # distinct (model, field) pairs logged; the count goes on beyond


def on_unknown_field(hook: Callable[[str, str], None]) -> None:
    """Call ``hook(model, field)`` for each unknown field received from now on."""
    _hooks.append(hook)


def version_of(user_agent: str | None) -> str | None:
    """The release a request's ``User-Agent`` names (``hyperpod/0.2.0``), or None."""
    found = USER_AGENT.search(user_agent or "")
    return found.group(1) if found else None


@functools.cache
def _known(model: type[BaseModel]) -> frozenset[str]:
    """A model's field names and aliases: asked once per model, not per message."""
    fields = model.model_fields
    return frozenset(fields) | {f.alias for f in fields.values() if f.alias is not None}


class Tolerant(BaseModel):
    """A message model that ignores, counts and logs the fields it does not know."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _unknown_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        known = _known(cls)
        unknown = [k for k in data if k not in known]
        if not unknown:
            return data
        for name in unknown:
            field = str(name)[:64]
            for hook in _hooks:
                hook(cls.__name__, field)
            with _lock:
                first = (cls.__name__, field) not in _logged and len(_logged) < _MAX_LOGGED
                if first:
                    _logged.add((cls.__name__, field))
            if first:
                log.warning(
                    "%s: field %r not known to this release, ignored (a newer peer?)",
                    cls.__name__,
                    field,
                )
        return {k: v for k, v in data.items() if k in known}
