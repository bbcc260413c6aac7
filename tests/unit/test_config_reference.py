"""docs/configuration.md: generated from the models, complete, deterministic, and linked."""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path
from typing import Literal

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field

from hyperpod_agent import config_reference as ref
from hyperpod_agent.config_reference import (
    FILES,
    REGENERATE,
    Section,
    constraints,
    deprecation,
    first_difference,
    reference,
    render,
    rows,
    sections,
    type_text,
)

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "configuration.md"


def test_committed_reference_matches_the_models() -> None:
    committed = REFERENCE.read_text(encoding="utf-8") if REFERENCE.exists() else ""
    problem = first_difference(render(), committed)
    assert problem is None, f"docs/configuration.md is out of date at {problem}; run: {REGENERATE}"


def test_output_does_not_depend_on_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    first = render()
    monkeypatch.setattr(sys, "executable", "/somewhere/else/bin/python3")
    monkeypatch.setattr(socket, "gethostname", lambda: "other-host.example")
    second = render()
    assert first == second
    # today: [deep_checks] command and agent.toml's node_name
    assert "<sys.executable>" in first or "<hostname -s>" in first
    for leak in (str(REPO), "/somewhere/else", "other-host"):
        assert leak not in second


def _keys_in(text: str, heading: str) -> list[str]:
    """The keys of one section's table."""
    shown = heading if heading == ref.TOP else f"`{heading}`"
    block = text.split(f": {shown}\n", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"^\| `([^`]+)`", block, re.MULTILINE)


def test_every_key_of_every_file_is_listed() -> None:
    text = render()
    for file in FILES:
        assert f"\n## {file.name}\n" in text
        for section in sections(file.model, file.fmt, "top level", {}):
            if section.same_as:
                continue
            file_part = text.split(f"\n## {file.name}\n", 1)[1]
            wanted = [f.alias or k for k, f in section.model.model_fields.items()]
            assert _keys_in(file_part, section.heading) == wanted, (file.name, section.heading)


def test_controller_sections_are_all_there() -> None:
    headings = [s.heading for s in sections(FILES[0].model, "toml", "top level", {})]
    for name in ("auth", "policy", "auto_resume", "provider", "progress", "deep_checks", "ha"):
        assert f"[{name}]" in headings
    assert "[policy.fault_overrides.<key>]" in headings


def test_suite_checks_get_one_table_per_kind() -> None:
    text = render()
    for kind in ("dcgm", "nccl", "nvlink", "ib", "stress", "script"):
        assert f'`[[checks]] with kind = "{kind}"`' in text
    # a default a validator fills in, asked of the model
    assert "by `diag_level`: 1: 120, 2: 600, 3: 3600, 4: 10800" in text
    assert "`duration_s` + 60" in text


class _Toy(BaseModel):
    """A ``toy`` section."""

    port: int = Field(default=8787, ge=1, le=65535, description="where it | listens")
    ratio: float = Field(default=0.1, gt=0, lt=1)
    name: str = Field(default="x", min_length=1, max_length=8, pattern=r"^[a-z]+$")
    mode: Literal["a", "b"] = "a"
    old: bool = Field(default=False, description="deprecated: use mode")
    older: int = Field(default=1, deprecated="use port")
    items: list[str] = Field(default_factory=lambda: [sys.executable, "-m"])
    needed: str
    path_of: Path | None = Field(default=None, description="a <root>/<job> directory")


def test_a_row_has_type_default_constraints_and_description() -> None:
    table = rows(Section("[toy]", _Toy, "toml"))
    assert table[0] == "| key | type | default | allowed | description |"
    by_key = {line.split(" | ")[0].removeprefix("| "): line for line in table[2:]}
    assert by_key["`port`"] == "| `port` | integer | `8787` | ≥ 1, ≤ 65535 | where it \\| listens |"
    assert "| float | `0.1` | > 0, < 1 |" in by_key["`ratio`"]
    assert "at least 1 character, at most 8 characters, matches `^[a-z]+$`" in by_key["`name`"]
    assert 'one of `"a"`, `"b"`' in by_key["`mode`"]
    assert '`[<sys.executable>, "-m"]`' in by_key["`items`"]
    assert "**required**" in by_key["`needed`"]
    # a tag-like word in prose is escaped, a path's None is "unset"
    assert "| path | unset |  | a &lt;root>/&lt;job> directory |" in by_key["`path_of`"]
    assert "**deprecated**" in by_key["`old` **deprecated**"]
    assert "**deprecated**" in by_key["`older` **deprecated**"]


def test_deprecation_comes_from_the_field_or_its_description() -> None:
    fields = _Toy.model_fields
    assert deprecation(fields["older"]) == "use port"
    assert deprecation(fields["old"]) == "deprecated: use mode"
    assert deprecation(fields["port"]) is None
    assert constraints(fields["mode"]) == ""


def test_deprecated_keys_of_the_models_are_listed_at_the_top() -> None:
    text = render()
    top = text.split("\n## ", 1)[0]
    for file in FILES:
        for section in sections(file.model, file.fmt, "top level", {}):
            for key, field in section.model.model_fields.items():
                if deprecation(field) and not section.same_as:
                    assert f"{file.name} `{section.heading}` `{key}`" in top


def test_type_text_for_json_and_toml() -> None:
    assert type_text(float, "toml") == "float"
    assert type_text(float, "json") == "number"
    assert type_text(dict[str, int], "toml") == "table of string → integer"
    assert type_text(list[_Toy], "json") == "list of objects"
    assert type_text(int | None, "toml") == "integer"


def test_first_difference_names_the_line() -> None:
    assert first_difference("a\nb\n", "a\nb\n") is None
    assert first_difference("a\nb\n", "a\nc\n") == "line 2: the models give 'b', the file has 'c'"
    assert first_difference("a\nb\n", "a\n") == "line 2: the models give 2 lines, the file has 1"


def test_command_writes_and_checks(tmp_path: Path) -> None:
    out = tmp_path / "configuration.md"
    runner = CliRunner()
    assert runner.invoke(reference, ["--output", str(out)]).exit_code == 0
    assert out.read_text(encoding="utf-8") == render()
    assert runner.invoke(reference, ["--output", str(out), "--check"]).exit_code == 0
    out.write_text(render().replace("| `listen_port` |", "| `listen_prot` |"), encoding="utf-8")
    result = runner.invoke(reference, ["--output", str(out), "--check"])
    assert result.exit_code == 1
    assert "out of date at line" in result.output and REGENERATE in result.output
    printed = runner.invoke(reference, [])
    assert printed.exit_code == 0 and printed.output == render()


def test_main_runs_as_a_module(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        ref.main([])
    assert done.value.code == 0
    assert capsys.readouterr().out == render()


@pytest.mark.parametrize(
    "doc",
    ["README.md", "docs/controller.md", "docs/cli.md", "docs/provisioning.md"],
)
def test_the_reference_is_linked(doc: str) -> None:
    assert "configuration.md" in (REPO / doc).read_text(encoding="utf-8")
