"""docs/configuration.md, generated from the pydantic models of every file the product reads.

``python -m hyperpod_agent.config_reference --output docs/configuration.md`` writes it;
``--check`` compares instead and names the first difference. Every key of every section
gets its type, default, constraints and description, straight from the models, so the
reference cannot drift from what the code accepts (a unit test regenerates it).

The output is deterministic: defaults a factory computes on this machine (the Python
that runs the controller, this host's name) are shown as placeholders in angle brackets.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from hyperpod_agent.admin.config import AdminConfig
from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.config_fields import (
    Format,
    cell,
    constraints,
    default_text,
    deprecation,
    docstring,
    is_model,
    members,
    schema_note,
    type_text,
)
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.deepcheck.config import Suite
from hyperpod_agent.provision.models import ProvisioningParameters, ResourceConfig

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
    for tp in members(field.annotation):
        origin = typing.get_origin(tp)
        kind, inner = "table", [tp]
        if origin in (list, tuple):
            kind, inner = "list", members(typing.get_args(tp)[0])
        elif origin is dict:
            kind, inner = "dict", members(typing.get_args(tp)[1])
        for model in inner:
            if is_model(model):
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
        note = schema_note(field)
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
            cell(type_cell),
            cell(default_text(section.model, key, field, section.fmt)),
            cell(constraints(field)),
            cell(description),
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
                    out.append(f"- {file.name} `{section.heading}` `{key}`: {cell(why)}")
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
            intro = docstring(section.model)
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
