"""``hyperpod node check``: the exit status by outcome and the result table."""

from __future__ import annotations

from typing import Any

import pytest

from hyperpod_agent.admin import render
from hyperpod_agent.admin.checks_cli import exit_status


def run(*outcomes: tuple[str, str]) -> dict[str, Any]:
    return {
        "id": 3,
        "nodes": [n for n, _ in outcomes],
        "level": "quick",
        "purpose": "admin",
        "phase": "done",
        "job_id": 12,
        "error": "",
        "outcomes": [
            {
                "node": n,
                "outcome": o,
                "cause": "c",
                "results": [
                    {"check": "nccl", "outcome": o, "duration_s": 1.25, "cause": f"{n} {o}"}
                ],
            }
            for n, o in outcomes
        ],
    }


@pytest.mark.parametrize(
    ("outcomes", "code"),
    [
        ((("node1", "OK"), ("node2", "OK")), 0),
        ((("node1", "OK"), ("node2", "FAIL")), 1),
        ((("node1", "UNKNOWN"), ("node2", "OK")), 3),
        ((("node1", "UNKNOWN"), ("node2", "FAIL")), 1),
        ((), 3),  # a run that judged nothing passes nothing
    ],
)
def test_exit_status(outcomes: tuple[tuple[str, str], ...], code: int) -> None:
    assert exit_status(run(*outcomes)) == code


def test_the_table_names_every_node_and_check() -> None:
    text = render.check_run(run(("node1", "OK"), ("node2", "FAIL")))
    lines = text.splitlines()
    assert lines[0] == "deep check run 3 (admin, quick) on node1,node2: done, job 12"
    assert lines[2].split() == ["node1", "nccl", "OK", "1.2", "node1", "OK"]
    assert lines[3].split()[:3] == ["node2", "nccl", "FAIL"]
    assert lines[-1] == "node1 OK, node2 FAIL"


def test_node_show_lists_the_deep_check_outcomes() -> None:
    from datetime import UTC, datetime

    outcome = {
        "run_id": 4, "node": "node2", "purpose": "reentry", "outcome": "FAIL",
        "check": "nccl", "cause": "busbw 40 GB/s < floor 150 GB/s", "ran": True,
        "at": "2026-11-24T10:00:00+00:00",
    }  # fmt: skip
    text = render.node_detail({"name": "node2", "deep_checks": [outcome]}, datetime.now(UTC))
    section = text.split("Deep checks:\n", 1)[1].splitlines()
    assert section[0].split() == ["AT", "RUN", "PURPOSE", "OUTCOME", "CHECK", "CAUSE"]
    assert section[1].split()[2:6] == ["4", "reentry", "FAIL", "nccl"]
