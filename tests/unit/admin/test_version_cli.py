"""``hyperpod version`` against a stub controller over real loopback HTTP."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click
import pytest
from click.testing import CliRunner

from hyperpod_agent import __version__
from hyperpod_agent.admin.version_cli import release_distance, version

if TYPE_CHECKING:
    from conftest import Stub


def run(stub: Stub, command: click.Command, *args: str) -> Any:
    return CliRunner().invoke(command, [*args, "--config", str(stub.config)])


def nodes(**releases: str | None) -> list[dict[str, Any]]:
    return [{"name": n, "agent_version": r} for n, r in releases.items()]


def test_each_release_with_its_nodes_and_the_far_ones_flagged(stub: Stub) -> None:
    stub.answer("GET", "/v1/status", 200, {"version": "0.3.0", "api_version": 1})
    agents = nodes(node1="0.3.0", node2="0.2.1", node3="0.1.0", node4=None)
    stub.answer("GET", "/v1/nodes", 200, agents)
    result = run(stub, version)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"cli         {__version__}"
    assert lines[1] == "controller  0.3.0 (api 1)"
    assert "0.1.0: 1 node (node3)" in result.output
    assert "0.3.0: 1 node (node1)" in result.output
    assert "unknown: 1 node (node4)" in result.output
    assert lines[-1].startswith("warning: more than one release") and lines[-1].endswith("node3")


def test_json_and_a_controller_too_old_to_say(stub: Stub) -> None:
    stub.answer("GET", "/v1/status", 200, {"nodes_total": 1})
    stub.answer("GET", "/v1/nodes", 200, [{"name": "node1"}])
    result = run(stub, version, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc == {
        "cli": __version__,
        "controller": None,
        "api_version": None,
        "agents": {"node1": None},
        "too_far": [],
    }
    assert "older than 0.2.0" in run(stub, version).output


def test_an_unreachable_controller_is_one_line_and_non_zero() -> None:
    result = CliRunner().invoke(version, ["--url", "http://127.0.0.1:9", "--timeout", "2"])
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [("0.1.0", "0.2.0.dev0", 1), ("0.1.0", "0.3.0", 2), ("1.4.0", "2.0.1", 1), ("x", "0.1", None)],
)
def test_release_distance(a: str, b: str, distance: int | None) -> None:
    assert release_distance(a, b) == distance
