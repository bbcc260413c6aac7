"""``hyperpod version``: where a cluster stands during a rollout (docs/upgrades.md).

This CLI's release, the controller's (``/v1/status``) and each agent's, as named by its
latest request (``/v1/nodes``). A controller and an agent more than one release apart
are outside what is tested; those nodes are flagged.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import click

from hyperpod_agent import __version__
from hyperpod_agent.admin.common import (
    _emit,
    _obj,
    _rows,
    connection_options,
    json_option,
    make_client,
    one_line_errors,
)

_RELEASE = re.compile(r"^(\d+)\.(\d+)")


def release_distance(a: str | None, b: str | None) -> int | None:
    """How many releases apart two versions are (0.1.x vs 0.2.y: 1); None if unknown.
    Before 1.0 a minor version is a release; after, a major one."""
    ma, mb = _RELEASE.match(a or ""), _RELEASE.match(b or "")
    if ma is None or mb is None:
        return None
    (a1, a2), (b1, b2) = (int(ma[1]), int(ma[2])), (int(mb[1]), int(mb[2]))
    if a1 == b1 == 0:
        return abs(a2 - b2)
    return abs(a1 - b1)


def versions(status: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The document ``hyperpod version --json`` prints."""
    controller = status.get("version")  # None: a controller older than 0.2.0
    agents = {str(n.get("name")): n.get("agent_version") for n in nodes}
    far = sorted(
        name
        for name, release in agents.items()
        if (d := release_distance(release, controller)) is not None and d > 1
    )
    return {
        "cli": __version__,
        "controller": controller,
        "api_version": status.get("api_version"),
        "agents": agents,
        "too_far": far,
    }


def render(doc: dict[str, Any]) -> str:
    by_release: dict[str, list[str]] = defaultdict(list)
    for name, release in sorted(doc["agents"].items()):
        by_release[release or "unknown"].append(name)
    controller = doc["controller"] or "older than 0.2.0 (it does not say)"
    if doc.get("api_version") is not None:
        controller += f" (api {doc['api_version']})"
    lines = [f"cli         {doc['cli']}", f"controller  {controller}"]
    label = "agents"
    for release, names in sorted(by_release.items()):
        count = f"{len(names)} node{'s' if len(names) != 1 else ''}"
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        lines.append(f"{label:<11} {release}: {count} ({shown})")
        label = ""
    if not doc["agents"]:
        lines.append("agents      none known yet")
    if "unknown" in by_release:
        lines.append("            unknown: no request from that agent since the controller started")
    if doc["too_far"]:
        lines.append(
            "warning: more than one release from the controller, outside what is tested: "
            + ", ".join(doc["too_far"])
        )
    return "\n".join(lines)


@click.command("version")
@connection_options
@json_option
@one_line_errors
def version(
    url: str | None,
    munge_socket: Path | None,
    config_file: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """This CLI's release, the controller's and every agent's."""
    client = make_client(url, munge_socket, config_file, timeout)
    doc = versions(_obj(client.status()), _rows(client.nodes()))
    _emit(doc, as_json, render)
