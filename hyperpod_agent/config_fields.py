"""How one config key reads in docs/configuration.md: its type, default, constraints,
deprecation and description, from the pydantic field (config_reference.py puts the
keys together into sections and the page)."""

from __future__ import annotations

import enum
import inspect
import json
import re
import socket
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Literal

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from hyperpod_agent.deepcheck.config import DcgmCheck, StressCheck

Format = Literal["toml", "json"]


@dataclass(frozen=True)
class Placeholder:
    """A default that depends on the machine, shown by what it stands for."""

    text: str


def _derived_defaults() -> dict[tuple[type[BaseModel], str], str]:
    """Keys the model requires but a validator fills when they are left out: asked of the
    models themselves, so the text follows them."""
    by_level = {
        level: DcgmCheck.model_validate({"kind": "dcgm", "name": "x", "diag_level": level})
        for level in range(1, 5)
    }
    dcgm = ", ".join(f"{level}: {check.timeout_s:g}" for level, check in by_level.items())
    stress = StressCheck.model_validate({"kind": "stress", "name": "x", "duration_s": 1})
    return {
        (DcgmCheck, "timeout_s"): f"by `diag_level`: {dcgm}",
        (StressCheck, "timeout_s"): f"`duration_s` + {stress.timeout_s - 1:g}",
    }


def _stable(value: Any) -> Any:
    """A factory-made default with this machine's values replaced by placeholders."""
    machine = {
        sys.executable: "<sys.executable>",
        socket.gethostname(): "<hostname>",
        socket.gethostname().split(".")[0]: "<hostname -s>",
    }
    if isinstance(value, str | PurePath) and str(value) in machine:
        return Placeholder(machine[str(value)])
    if isinstance(value, list | tuple):
        return [_stable(v) for v in value]
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items()}
    return value


# --- types -------------------------------------------------------------------------------


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def members(tp: Any) -> list[Any]:
    """The non-None members of a union (or the type itself)."""
    tp = _unwrap(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [_unwrap(a) for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _literal(value: Any, fmt: Format) -> str:
    """A value as the file would spell it."""
    if isinstance(value, Placeholder):
        return value.text
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, PurePath):
        value = str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_literal(v, fmt) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        sep = " = " if fmt == "toml" else ": "
        inner = ", ".join(f"{json.dumps(str(k))}{sep}{_literal(v, fmt)}" for k, v in value.items())
        return "{ " + inner + " }" if fmt == "toml" else "{" + inner + "}"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


_SCALARS = {bool: "boolean", int: "integer", str: "string", Path: "path", Any: "any"}


def type_text(tp: Any, fmt: Format) -> str:
    """How a type reads in the reference."""
    choices = members(tp)
    if len(choices) > 1:
        return " or ".join(type_text(m, fmt) for m in choices)
    tp = choices[0]
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(f"`{_literal(v, fmt)}`" for v in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(f"`{_literal(m, fmt)}`" for m in tp)
    if origin in (list, tuple, Sequence):
        item = typing.get_args(tp)[0]
        if all(is_model(m) for m in members(item)):
            return "list of tables" if fmt == "toml" else "list of objects"
        return f"list of {type_text(item, fmt)}"
    if origin is dict:
        key, val = typing.get_args(tp)
        table = "table" if fmt == "toml" else "object"
        return f"{table} of {type_text(key, fmt)} → {type_text(val, fmt)}"
    if is_model(tp):
        return "table" if fmt == "toml" else "object"
    if tp is float:
        return "float" if fmt == "toml" else "number"
    return _SCALARS.get(tp, getattr(tp, "__name__", str(tp)))


# --- one key -----------------------------------------------------------------------------


def _num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _count(number: int, unit: str) -> str:
    return f"{number} {unit if number != 1 else unit.removesuffix('s')}"


def constraints(field: FieldInfo) -> str:
    """gt/ge/lt/le, lengths and patterns, as one short text."""
    out: list[str] = []
    container = typing.get_origin(members(field.annotation)[0]) in (list, dict, tuple)
    unit = "items" if container else "characters"
    for meta in field.metadata:
        if isinstance(meta, at.Gt):
            out.append(f"> {_num(meta.gt)}")
        elif isinstance(meta, at.Ge):
            out.append(f"≥ {_num(meta.ge)}")
        elif isinstance(meta, at.Lt):
            out.append(f"< {_num(meta.lt)}")
        elif isinstance(meta, at.Le):
            out.append(f"≤ {_num(meta.le)}")
        elif isinstance(meta, at.MinLen):
            out.append(f"at least {_count(meta.min_length, unit)}")
        elif isinstance(meta, at.MaxLen):
            out.append(f"at most {_count(meta.max_length, unit)}")
        elif getattr(meta, "pattern", None):
            out.append(f"matches `{meta.pattern}`")
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("pattern"), str):
        out.append(f"matches `{extra['pattern']}`")
    return ", ".join(out)


def schema_note(field: FieldInfo) -> dict[str, Any]:
    """What an ``Annotated`` type's own JSON schema says (a description, other forms)."""
    for meta in field.metadata:
        schema = getattr(meta, "json_schema", None)
        if isinstance(schema, dict):
            return schema
    return {}


def deprecation(field: FieldInfo) -> str | None:
    """Why a key is deprecated (``Field(deprecated=...)`` or a description that says so)."""
    if field.deprecated:
        return field.deprecated if isinstance(field.deprecated, str) else "deprecated"
    if (field.description or "").lower().startswith("deprecated"):
        return field.description
    return None


def default_text(model: type[BaseModel], name: str, field: FieldInfo, fmt: Format) -> str:
    """The default as the file would spell it; ``required`` or ``unset`` otherwise."""
    derived = _derived_defaults().get((model, name))
    if derived is not None:
        return derived
    if field.default is PydanticUndefined and field.default_factory is None:
        return "**required**"
    value: Any = field.get_default(call_default_factory=True, validated_data={})
    if field.default_factory is not None:
        value = _stable(value)
    if isinstance(value, BaseModel):
        return "—"
    if value is None:
        return "unset"
    return f"`{_literal(value, fmt)}`"


def cell(text: str) -> str:
    """One table cell: one line, ``rst`` literals as Markdown code, no stray HTML."""
    parts = re.sub(r"``([^`]+)``", r"`\1`", " ".join(text.split())).split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", parts[i])
    return "`".join(parts).replace("|", "\\|")


def docstring(model: type[BaseModel]) -> str:
    """The model's own docstring as one paragraph, without references to the design notes,
    which are not published with the docs."""
    doc = model.__dict__.get("__doc__")
    if not isinstance(doc, str):
        return ""
    text = re.sub(r"\s*\(DESIGN §\d+\)", "", inspect.cleandoc(doc))
    text = re.sub(
        r"DESIGN §\d+(,\s+|\s+(?=table))", lambda m: "" if "," in m.group(1) else "the ", text
    )
    return cell(text)


# --- sections ----------------------------------------------------------------------------
