"""docs/configuration.md, generated from the pydantic models of every file the product reads.

``python -m hyperpod_agent.config_reference --output docs/configuration.md`` writes it;
``--check`` compares instead and names the first difference. Every key of every section
gets its type, default, constraints and description, straight from the models, so the
reference cannot drift from what the code accepts (a unit test regenerates it).

The output is deterministic: defaults a factory computes on this machine (the Python
that runs the controller, this host's name) are shown as placeholders in angle brackets.
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import socket
import sys
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Literal

import annotated_types as at
import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from hyperpod_agent.admin.config import AdminConfig
from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.deepcheck.config import DcgmCheck, StressCheck, Suite
from hyperpod_agent.provision.models import ProvisioningParameters, ResourceConfig

Format = Literal["toml", "json"]
TOP = "top level"
REGENERATE = "python -m hyperpod_agent.config_reference --output docs/configuration.md"


@dataclass(frozen=True)
class ConfigFile:
    """One file the product reads, and the model that validates it."""

    name: str
    where: str
    model: type[BaseModel]
    fmt: Format
    docs: str


FILES: tuple[ConfigFile, ...] = (
    ConfigFile(
        "controller.toml",
        "`/etc/hyperpod/controller.toml`, or `hyperpod controller run --config PATH`",
        ControllerConfig,
        "toml",
        "[controller.md](controller.md), [auto-resume.md](auto-resume.md), "
        "[deep-checks.md](deep-checks.md), [security.md](security.md)",
    ),
    ConfigFile(
        "agent.toml",
        "`/etc/hyperpod/agent.toml`, or `hyperpod agent run --config PATH`",
        AgentConfig,
        "toml",
        "[agent.md](agent.md), [probes.md](probes.md), [security.md](security.md)",
    ),
    ConfigFile(
        "admin.toml",
        "`--config`, `HYPERPOD_ADMIN_CONFIG` or `/etc/hyperpod/admin.toml` (the admin CLI)",
        AdminConfig,
        "toml",
        "[cli.md](cli.md), [security.md](security.md)",
    ),
    ConfigFile(
        "deep-check suite",
        "the file `[deep_checks] suite` of controller.toml names",
        Suite,
        "toml",
        "[deep-checks.md](deep-checks.md)",
    ),
    ConfigFile(
        "provisioning_parameters.json",
        "the file given to `hyperpod provision validate`, `plan` or `apply`",
        ProvisioningParameters,
        "json",
        "[provisioning.md](provisioning.md)",
    ),
    ConfigFile(
        "resource_config.json",
        "`hyperpod provision apply --resource-config PATH`: which machine is which node",
        ResourceConfig,
        "json",
        "[provisioning.md](provisioning.md)",
    ),
)


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


def _members(tp: Any) -> list[Any]:
    """The non-None members of a union (or the type itself)."""
    tp = _unwrap(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [_unwrap(a) for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def _is_model(tp: Any) -> bool:
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
    members = _members(tp)
    if len(members) > 1:
        return " or ".join(type_text(m, fmt) for m in members)
    tp = members[0]
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(f"`{_literal(v, fmt)}`" for v in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(f"`{_literal(m, fmt)}`" for m in tp)
    if origin in (list, tuple, Sequence):
        item = typing.get_args(tp)[0]
        if all(_is_model(m) for m in _members(item)):
            return "list of tables" if fmt == "toml" else "list of objects"
        return f"list of {type_text(item, fmt)}"
    if origin is dict:
        key, val = typing.get_args(tp)
        table = "table" if fmt == "toml" else "object"
        return f"{table} of {type_text(key, fmt)} → {type_text(val, fmt)}"
    if _is_model(tp):
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
    container = typing.get_origin(_members(field.annotation)[0]) in (list, dict, tuple)
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


def _schema_note(field: FieldInfo) -> dict[str, Any]:
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


def _cell(text: str) -> str:
    """One table cell: one line, ``rst`` literals as Markdown code, no stray HTML."""
    parts = re.sub(r"``([^`]+)``", r"`\1`", " ".join(text.split())).split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", parts[i])
    return "`".join(parts).replace("|", "\\|")


def _docstring(model: type[BaseModel]) -> str:
    """The model's own docstring as one paragraph, without references to the design notes,
    which are not published with the docs."""
    doc = model.__dict__.get("__doc__")
    if not isinstance(doc, str):
        return ""
    text = re.sub(r"\s*\(DESIGN §\d+\)", "", inspect.cleandoc(doc))
    text = re.sub(
        r"DESIGN §\d+(,\s+|\s+(?=table))", lambda m: "" if "," in m.group(1) else "the ", text
    )
    return _cell(text)


# --- sections ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    """One table: a model at a place in its file."""

    heading: str
    model: type[BaseModel]
    fmt: Format
    same_as: str | None = None


def _child_heading(parent: str, key: str, fmt: Format, kind: str) -> str:
    if fmt == "json":
        base = key if parent == TOP else f"{parent}.{key}"
        return {"list": f"{base}[]", "dict": f"{base}.<key>"}.get(kind, base)
    base = key if parent == TOP else parent.strip("[]") + "." + key
    return {"list": f"[[{base}]]", "dict": f"[{base}.<key>]"}.get(kind, f"[{base}]")


def _children(field: FieldInfo) -> Iterator[tuple[str, type[BaseModel], str]]:
    """(kind, model, discriminator value) for each model a key holds."""
    for tp in _members(field.annotation):
        origin = typing.get_origin(tp)
        kind, inner = "table", [tp]
        if origin in (list, tuple):
            kind, inner = "list", _members(typing.get_args(tp)[0])
        elif origin is dict:
            kind, inner = "dict", _members(typing.get_args(tp)[1])
        for model in inner:
            if _is_model(model):
                tag = model.model_fields.get("kind")
                value = typing.get_args(tag.annotation)[0] if tag is not None else ""
                yield kind, model, str(value) if len(inner) > 1 else ""


def sections(
    model: type[BaseModel], fmt: Format, heading: str, seen: dict[type[BaseModel], str]
) -> Iterator[Section]:
    """The model's own table, then one per nested model, depth first."""
    if model in seen:
        yield Section(heading, model, fmt, same_as=seen[model])
        return
    seen[model] = heading
    yield Section(heading, model, fmt)
    for key, field in model.model_fields.items():
        for kind, child, tag in _children(field):
            sub = _child_heading(heading, field.alias or key, fmt, kind)
            if tag:
                sub = f'{sub} with kind = "{tag}"'
            yield from sections(child, fmt, sub, seen)


def _key_cell(key: str, field: FieldInfo) -> str:
    name = f"`{field.alias or key}`"
    if deprecation(field):
        name += " **deprecated**"
    return name


def rows(section: Section) -> list[str]:
    """The table rows of a section."""
    out = [
        "| key | type | default | allowed | description |",
        "|---|---|---|---|---|",
    ]
    for key, field in section.model.model_fields.items():
        note = _schema_note(field)
        if "anyOf" in note:
            kinds = [
                f"list of {o['items']['type']}" if o.get("type") == "array" else o.get("type", "")
                for o in note["anyOf"]
            ]
            type_cell = " or ".join(kinds)
        else:
            type_cell = type_text(field.annotation, section.fmt)
        below = dict.fromkeys(
            _child_heading(section.heading, field.alias or key, section.fmt, kind)
            for kind, _, _ in _children(field)
        )
        if below:
            type_cell += ", see " + ", ".join(f"`{h}`" for h in below)
        description = field.description or note.get("description", "")
        cells = [
            _key_cell(key, field),
            _cell(type_cell),
            _cell(default_text(section.model, key, field, section.fmt)),
            _cell(constraints(field)),
            _cell(description),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _deprecated_keys() -> list[str]:
    out = []
    for file in FILES:
        for section in sections(file.model, file.fmt, TOP, {}):
            if section.same_as:
                continue
            for key, field in section.model.model_fields.items():
                why = deprecation(field)
                if why:
                    out.append(f"- {file.name} `{section.heading}` `{key}`: {_cell(why)}")
    return out


def render() -> str:
    """The whole reference, as Markdown ending in a newline."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from the pydantic models; do not edit. Regenerate with",
        f"     {REGENERATE} -->",
        "",
        "Every key of every file hyperpod-agent reads, with its type, default, allowed values",
        "and description, generated from the models that validate the files (a unit test fails",
        f"when this page and the models differ; `{REGENERATE}` regenerates it).",
        "What the keys do, and the rules between keys, are in the topic documents each file",
        "links to. TOML files list only what they change; every key shown with a default may be",
        "left out. A default in angle brackets depends on the machine (`<sys.executable>`: the",
        "Python that runs the program; `<hostname -s>`: this host's short name).",
        "",
        "Not here: the checkpoint library is set up by environment variables",
        "([checkpoint.md](checkpoint.md)), the SPANK plugin by its `plugstack.conf` arguments",
        "([spank_plugin/README.md](../spank_plugin/README.md)).",
        "",
        "| file | where | model | more |",
        "|---|---|---|---|",
    ]
    for file in FILES:
        qualname = f"{file.model.__module__}.{file.model.__qualname__}"
        lines.append(
            f"| [{file.name}](#{_anchor(file.name)}) | {file.where} | `{qualname}` | {file.docs} |"
        )
    deprecated = _deprecated_keys()
    lines += ["", "Deprecated keys (still accepted; the description says what replaces them):", ""]
    lines += deprecated or ["- none"]
    for file in FILES:
        lines += ["", f"## {file.name}", "", f"Read from {file.where}; more in {file.docs}."]
        for section in sections(file.model, file.fmt, TOP, {}):
            where = section.heading if section.heading == TOP else f"`{section.heading}`"
            lines += ["", f"### {file.name}: {where}", ""]
            if section.same_as:
                lines.append(f"The same keys as `{section.same_as}` above.")
                continue
            intro = _docstring(section.model)
            if intro:
                lines += [intro, ""]
            lines += rows(section)
    return "\n".join(lines) + "\n"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def first_difference(expected: str, actual: str) -> str | None:
    """The first line where ``actual`` differs from ``expected``, or None."""
    want, have = expected.splitlines(), actual.splitlines()
    for number, (a, b) in enumerate(zip(want, have, strict=False), start=1):
        if a != b:
            return f"line {number}: the models give {a!r}, the file has {b!r}"
    if len(want) != len(have):
        number = min(len(want), len(have)) + 1
        return f"line {number}: the models give {len(want)} lines, the file has {len(have)}"
    return None if expected == actual else "the files differ in line endings"


@click.command("reference")
@click.option(
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="write the reference here (default: standard output)",
)
@click.option("--check", is_flag=True, help="compare with --output instead of writing it")
def reference(output: Path | None, check: bool) -> None:
    """Print or write the configuration reference (docs/configuration.md)."""
    text = render()
    if output is None:
        if check:
            raise click.UsageError("--check needs --output")
        click.echo(text, nl=False)
        return
    if check:
        current = output.read_text(encoding="utf-8") if output.exists() else ""
        problem = first_difference(text, current)
        if problem is not None:
            raise click.ClickException(f"{output}: out of date at {problem}; run: {REGENERATE}")
        click.echo(f"{output}: up to date")
        return
    output.write_text(text, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m hyperpod_agent.config_reference``."""
    reference.main(args=list(argv) if argv is not None else None, prog_name=__name__)


if __name__ == "__main__":
    main()
