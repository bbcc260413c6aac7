"""``POST /v1/checks``: admin only, and every refusal starts nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from test_api import Api, error_of

from hyperpod_agent.controller.config import ControllerConfig

SUITE = """
[[checks]]
name = "dcgm"
kind = "dcgm"
"""


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE)
    cfg = a.controller.config
    deep = cfg.deep_checks.model_copy(update={"suite": suite, "results_dir": tmp_path / "r"})
    a.controller.config = ControllerConfig.model_validate(
        {**cfg.model_dump(), "deep_checks": deep.model_dump()}
    )
    a.controller.reconcile_once()
    yield a
    a.client.close()


def test_an_admin_starts_a_run_and_reads_it(api: Api) -> None:
    resp = api.post("/v1/checks", {"nodes": ["node1", "node2"], "level": "quick"}, who="admin")
    assert resp.status_code == 202, resp.text
    run = resp.json()
    assert run["phase"] == "reserve" and run["nodes"] == ["node1", "node2"]
    assert api.controller.wake.is_set()
    got = api.get(f"/v1/checks/{run['id']}").json()
    assert got["id"] == run["id"] and got["reservation"].startswith("hyperpod-check-")
    assert [r["id"] for r in api.get("/v1/checks").json()] == [run["id"]]


@pytest.mark.parametrize(
    ("body", "status", "code", "says"),
    [
        ({"nodes": ["node1", "nosuch"]}, 404, "not_found", "unknown node(s): nosuch"),
        ({"nodes": []}, 422, "invalid", "nodes"),
        ({"nodes": ["node1", "node1"]}, 422, "invalid", "named twice"),
        ({"nodes": ["../x"]}, 422, "invalid", "not a node name"),
        ({"nodes": ["node1"], "level": "deep"}, 422, "invalid", "level"),
    ],
)
def test_bad_requests_start_nothing(
    api: Api, body: dict[str, object], status: int, code: str, says: str
) -> None:
    resp = api.post("/v1/checks", body, who="admin")
    err = error_of(resp)
    assert resp.status_code == status and err["code"] == code and says in str(err), err
    assert api.store.recent_check_runs() == []


def test_a_node_running_jobs_needs_drain_first(api: Api) -> None:
    api.slurm.nodes["node1"] = replace(api.slurm.nodes["node1"], state="MIXED")
    resp = api.post("/v1/checks", {"nodes": ["node1"]}, who="admin")
    assert resp.status_code == 409 and error_of(resp)["code"] == "in_use"
    assert "running jobs: node1" in error_of(resp)["message"]
    assert api.store.recent_check_runs() == []
    resp = api.post("/v1/checks", {"nodes": ["node1"], "drain_first": True}, who="admin")
    assert resp.status_code == 202 and resp.json()["phase"] == "draining"


def test_a_node_under_a_check_is_busy(api: Api) -> None:
    assert api.post("/v1/checks", {"nodes": ["node1"]}, who="admin").status_code == 202
    resp = api.post("/v1/checks", {"nodes": ["node2", "node1"]}, who="admin")
    assert resp.status_code == 409 and error_of(resp)["code"] == "busy"


def test_a_broken_suite_or_none_is_refused(api: Api, tmp_path: Path) -> None:
    suite = api.controller.config.deep_checks.suite
    assert suite is not None
    suite.write_text("[[checks]]\nname = 'x'\nkind = 'warp'\n")
    resp = api.post("/v1/checks", {"nodes": ["node1"]}, who="admin")
    assert resp.status_code == 409 and error_of(resp)["code"] == "bad_suite"
    assert str(suite) in error_of(resp)["message"]
    cfg = api.controller.config
    api.controller.config = cfg.model_copy(
        update={"deep_checks": cfg.deep_checks.model_copy(update={"suite": None})}
    )
    resp = api.post("/v1/checks", {"nodes": ["node1"]}, who="admin")
    assert resp.status_code == 409 and error_of(resp)["code"] == "not_configured"
    assert api.store.recent_check_runs() == []


def test_only_an_admin_may_start_one(api: Api) -> None:
    resp = api.post("/v1/checks", {"nodes": ["node1"]}, who="node1")
    assert resp.status_code == 403
    assert api.store.recent_check_runs() == []
