"""The HTTP API through httpx's TestClient, with real token authentication."""

from __future__ import annotations

import json
import time
import urllib.parse
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import FakeSlurm, cluster, config, node

with warnings.catch_warnings():
    # starlette asks for its httpx fork; the httpx we have works the same for these tests
    warnings.filterwarnings("ignore", message=".*httpx2.*")
    from fastapi.testclient import TestClient

from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig, AuthError
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.controller.api.app import create_app
from hyperpod_agent.controller.api.rejections import Rejections
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
from hyperpod_agent.controller.service import Controller
from hyperpod_agent.controller.store.facade import Store


class Api:
    def __init__(
        self,
        tmp: Path,
        rejections: Rejections | None = None,
        auth: dict[str, Any] | None = None,
        deep_checks: dict[str, Any] | None = None,
    ) -> None:
        secret = tmp / "secret"
        secret.write_text("s" * 48)
        fields = {"mode": "token", "token_secret_file": str(secret), **(auth or {})}
        self.auth_config = AuthConfig.model_validate(fields)
        nodes = cluster(4)
        nodes["node5"] = node("node5", flags=("DRAIN",), reason="hyperpod:spare")
        self.slurm = FakeSlurm(nodes)
        self.store = Store(tmp / "s.db")
        cfg = config(auth=fields, deep_checks=deep_checks or {})
        self.controller = Controller(cfg, self.store, self.slurm, SparePoolProvider(self.slurm))
        app = create_app(self.controller, ServerAuth(self.auth_config), rejections)
        self.client = TestClient(app)

    def headers(self, who: str | None, method: str, path: str, body: bytes) -> dict[str, str]:
        if who is None:
            return {}
        node_name = None if who == "admin" else who
        return ClientAuth(self.auth_config, node_name).headers(method, path, body)

    def post(
        self,
        path: str,
        body: Any,
        who: str | None = "node2",
        raw: bytes | None = None,
        extra: dict[str, str] | None = None,
    ) -> Any:
        data = raw if raw is not None else json.dumps(body).encode()
        headers = {
            "content-type": "application/json",
            **self.headers(who, "POST", path, data),
            **(extra or {}),
        }
        return self.client.post(path, content=data, headers=headers)

    def get(self, path: str, who: str | None = "admin") -> Any:
        return self.client.get(path, headers=self.headers(who, "GET", path, b""))


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.client.close()


def now_iso(delta: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=delta)).isoformat()


def report(
    name: str = "node2", seq: int = 1, agent: str = "agent-a", faulty: bool = True, **over: Any
) -> dict[str, Any]:
    findings = (
        [
            {
                "component": "gpu0",
                "code": "xid79",
                "status": "FAIL",
                "action": "REBOOT",
                "urgent": True,
                "message": "GPU has fallen off the bus",
            }
        ]
        if faulty
        else []
    )
    body: dict[str, Any] = {
        "node": name,
        "agent_id": agent,
        "seq": seq,
        "generated_at": now_iso(),
        "verdict": "faulty" if faulty else "healthy",
        "confirmed": [
            {"probe": "gpu", "component": f["component"], "code": f["code"]} for f in findings
        ],
        "results": [
            {
                "probe": "gpu",
                "status": "FAIL" if faulty else "OK",
                "findings": findings,
                "at": now_iso(),
            }
        ],
    }
    body.update(over)
    return body


def error_of(resp: Any) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"] and body["error"]["message"]
    return dict(body["error"])


def nothing_stored(api: Api) -> bool:
    return api.store.node_rows() == {} and api.store.open_faults() == []


def test_healthz_needs_no_auth(api: Api) -> None:
    resp = api.client.get("/v1/healthz")
    assert resp.status_code == 200 and resp.json()["ok"] is True
    doc = resp.json()
    assert doc["role"] == "single" and doc["controller"] == api.controller.config.controller_id()


def test_report_is_stored_and_wakes_the_loop(api: Api) -> None:
    resp = api.post("/v1/reports", report())
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"accepted": True, "open_faults": 1}
    [f] = api.store.open_faults()
    assert (f.node, f.code, f.urgent) == ("node2", "xid79", True)
    assert api.controller.wake.is_set()
    assert [e.kind for e in api.store.events()] == ["fault"]


@pytest.mark.parametrize(
    ("raw", "status", "code", "needle"),
    [
        (b"{not json", 400, "malformed_json", "not valid JSON"),
        (b"", 422, "invalid", ""),
        (b"[]", 422, "invalid", ""),
        (json.dumps(report(seq="x")).encode(), 422, "invalid", "seq"),
        (json.dumps(report(seq=-1)).encode(), 422, "invalid", "seq"),
        (json.dumps(report(seq=2**63)).encode(), 422, "invalid", "seq"),
        (json.dumps(report(verdict="sick")).encode(), 422, "invalid", "verdict"),
        (json.dumps(report(node="../etc")).encode(), 422, "invalid", "node"),
        (
            json.dumps({k: v for k, v in report().items() if k != "agent_id"}).encode(),
            422,
            "invalid",
            "agent_id",
        ),
    ],
)
def test_bad_bodies_are_rejected_without_state_change(
    api: Api, raw: bytes, status: int, code: str, needle: str
) -> None:
    resp = api.post("/v1/reports", None, raw=raw)
    assert resp.status_code == status, resp.text
    err = error_of(resp)
    assert err["code"] == code and needle in err["message"]
    assert nothing_stored(api)


def test_oversized_body_is_413_before_parsing(api: Api) -> None:
    big = b"x" * (256 * 1024 + 1)
    resp = api.post("/v1/reports", None, raw=big)
    assert resp.status_code == 413 and error_of(resp)["code"] == "too_large"
    assert nothing_stored(api)


def test_lying_content_length_is_rejected(api: Api) -> None:
    resp = api.post("/v1/reports", None, raw=b"{}", extra={"content-length": "abc"})
    assert resp.status_code in (400, 422)


def test_unauthenticated_is_401(api: Api) -> None:
    resp = api.post("/v1/reports", report(), who=None)
    assert resp.status_code == 401
    assert "Authorization" in error_of(resp)["message"]
    assert nothing_stored(api)


def test_tampered_body_is_401(api: Api) -> None:
    body = json.dumps(report()).encode()
    headers = {
        "content-type": "application/json",
        **api.headers("node2", "POST", "/v1/reports", body),
    }
    tampered = body.replace(b"node2", b"node3")
    resp = api.client.post("/v1/reports", content=tampered, headers=headers)
    assert resp.status_code == 401 and nothing_stored(api)


def test_a_node_may_not_report_for_another(api: Api) -> None:
    resp = api.post("/v1/reports", report("node3"), who="node2")
    assert resp.status_code == 403
    assert "node3" in error_of(resp)["message"] and nothing_stored(api)


def test_an_admin_may_not_report_a_nodes_state_either(api: Api) -> None:
    # Admins act through /v1/nodes/{name}/actions, with a reason, never by
    # impersonating an agent.
    resp = api.post("/v1/reports", report("node3"), who="admin")
    assert resp.status_code == 403
    assert "node3" in error_of(resp)["message"] and nothing_stored(api)


def test_events_since_an_iso_time(api: Api) -> None:
    assert api.post("/v1/reports", report()).status_code == 200
    api.controller.reconcile_once()
    events = api.get("/v1/events").json()
    assert events
    assert api.get("/v1/events?since=2000-01-01T00:00:00Z").json() == events
    assert api.get("/v1/events?since=2999-01-01T00:00:00").json() == []
    last = events[-1]["at"]
    later = api.get(f"/v1/events?since={urllib.parse.quote(last)}").json()
    # Stored times have sub-microsecond digits the ISO form drops: >= at the edge.
    assert all(e["at"] >= last for e in later) and len(later) <= len(events)
    assert {e["id"] for e in later} <= {e["id"] for e in events}
    resp = api.get("/v1/events?since=yesterday")
    assert resp.status_code == 422
    assert "ISO 8601" in error_of(resp)["message"]


def test_events_of_one_kind(api: Api) -> None:
    assert api.post("/v1/reports", report()).status_code == 200
    api.controller.reconcile_once()
    events = api.get("/v1/events").json()
    kinds = {e["kind"] for e in events}
    assert len(kinds) >= 2, kinds
    kind = sorted(kinds)[0]
    only = api.get(f"/v1/events?kind={kind}").json()
    assert only and [e["id"] for e in only] == [e["id"] for e in events if e["kind"] == kind]
    assert api.get("/v1/events?kind=DROP%20TABLE").status_code == 422


def test_replayed_report_is_409(api: Api) -> None:
    assert api.post("/v1/reports", report(seq=5)).status_code == 200
    for seq in (5, 4):
        resp = api.post("/v1/reports", report(seq=seq, faulty=False))
        assert resp.status_code == 409 and error_of(resp)["code"] == "replayed"
    assert api.store.node_row("node2").verdict == "faulty"  # type: ignore[union-attr]


def test_stale_and_future_reports_are_409(api: Api) -> None:
    resp = api.post("/v1/reports", report(generated_at=now_iso(-3600)))
    assert resp.status_code == 409 and error_of(resp)["code"] == "stale"
    resp = api.post("/v1/reports", report(generated_at=now_iso(+3600)))
    assert resp.status_code == 409 and error_of(resp)["code"] == "from_future"
    assert nothing_stored(api)


def test_restarted_agent_may_start_again_at_seq_0(api: Api) -> None:
    assert api.post("/v1/reports", report(seq=9, generated_at=now_iso(-10))).status_code == 200
    resp = api.post("/v1/reports", report(seq=0, agent="agent-b", faulty=False))
    assert resp.status_code == 200
    old = api.post("/v1/reports", report(seq=0, agent="agent-c", generated_at=now_iso(-20)))
    assert old.status_code == 409 and error_of(old)["code"] == "stale"


def test_heartbeats(api: Api) -> None:
    beat = {"node": "node2", "agent_id": "a", "seq": 1, "sent_at": now_iso()}
    assert api.post("/v1/heartbeats", beat).status_code == 200
    assert api.controller.last_heartbeat("node2") is not None
    resp = api.post("/v1/heartbeats", beat)
    assert resp.status_code == 409 and error_of(resp)["code"] == "replayed"
    resp = api.post("/v1/heartbeats", {**beat, "node": "node3", "seq": 2})
    assert resp.status_code == 403
    # a newer agent's field is ignored (wire.Tolerant), a wrong value is not
    assert api.post("/v1/heartbeats", {**beat, "seq": 3, "extra": 1}).status_code == 200
    resp = api.post("/v1/heartbeats", {**beat, "seq": "four"})
    assert resp.status_code == 422


def test_unknown_path_and_method_are_json(api: Api) -> None:
    resp = api.get("/v1/nope")
    assert resp.status_code == 404 and error_of(resp)["code"] == "not_found"
    resp = api.client.delete("/v1/healthz")
    assert resp.status_code == 405 and error_of(resp)["code"] == "method_not_allowed"


def test_read_endpoints_after_a_pass(api: Api) -> None:
    api.post("/v1/reports", report())
    api.controller.reconcile_once()
    status = api.get("/v1/status").json()
    assert status["nodes_total"] == 5 and status["incident_mode"] is False
    assert status["by_verdict"]["faulty"] == 1
    assert status["pending_actions"] == 0
    nodes = {n["name"]: n for n in api.get("/v1/nodes").json()}
    assert nodes["node2"]["reason"].startswith("hyperpod:reboot gpu0 xid79")
    assert nodes["node2"]["verdict"] == "faulty" and nodes["node2"]["open_faults"] == 1
    detail = api.get("/v1/nodes/node2").json()
    assert detail["faults"][0]["code"] == "xid79"
    assert detail["actions"][0]["kind"] == "reboot" and detail["actions"][0]["state"] == "done"
    assert detail["report"]["agent_id"] == "agent-a"
    events = api.get("/v1/events?node=node2").json()
    assert [e["kind"] for e in events] == ["fault", "reboot"]
    since = api.get(f"/v1/events?since={events[0]['id']}").json()
    assert [e["kind"] for e in since] == ["reboot"]
    assert error_of(api.get("/v1/nodes/nodeX"))["code"] == "not_found"
    assert api.get("/v1/events?limit=0").status_code == 422
    assert api.get("/v1/jobs").json() == []
    assert api.get("/v1/jobs/7").status_code == 404


def test_read_endpoints_need_auth(api: Api) -> None:
    for path in ("/v1/status", "/v1/nodes", "/v1/nodes/node1", "/v1/jobs", "/v1/events"):
        assert api.get(path, who=None).status_code == 401, path


def test_admin_action(api: Api) -> None:
    body = {"action": "replace", "reason": "fan noise"}
    api.controller.reconcile_once()
    # No spare vouched for by its agent: a replacement is refused, nothing is recorded.
    refused = api.post("/v1/nodes/node3/actions", body, who="admin")
    assert refused.status_code == 409 and "node5: no report from its agent" in refused.text
    assert api.store.open_actions() == []
    assert api.post("/v1/reports", report("node5", faulty=False), who="node5").status_code == 200
    assert api.post("/v1/nodes/node3/actions", body, who="node3").status_code == 403
    assert api.post("/v1/nodes/nodeX/actions", body, who="admin").status_code == 404
    bad = api.post("/v1/nodes/node3/actions", {"action": "explode"}, who="admin")
    assert bad.status_code == 422
    resp = api.post("/v1/nodes/node3/actions", body, who="admin")
    assert resp.status_code == 202, resp.text
    accepted = resp.json()
    assert accepted["kind"] == "replace" and accepted["reason"].startswith("hyperpod:replace")
    api.controller.reconcile_once()
    assert api.slurm.nodes["node3"].drained and not api.slurm.nodes["node5"].drained
    action = api.store.action(accepted["action_id"])
    assert action is not None and action.state in ("applied", "done")


def test_admin_drain_is_a_hold(api: Api) -> None:
    api.controller.reconcile_once()
    resp = api.post("/v1/nodes/node1/actions", {"action": "drain", "reason": "bios"}, who="admin")
    assert resp.status_code == 202
    api.controller.reconcile_once()
    assert api.slurm.nodes["node1"].reason == "hyperpod:hold admin request bios"


def test_metrics_and_openapi(api: Api) -> None:
    api.post("/v1/reports", report())
    text = api.client.get("/metrics").text
    for name in (
        "hyperpod_faults_total",
        "hyperpod_reports_total",
        "hyperpod_incident_mode",
        "hyperpod_actions_total",
        "hyperpod_fault_to_drain_seconds",
        "hyperpod_requeues_total",
        "hyperpod_controller_nodes",
    ):
        assert name in text
    schema = api.client.get("/openapi.json").json()
    assert "/v1/reports" in schema["paths"] and "/v1/nodes/{name}/actions" in schema["paths"]


def test_slow_path_is_not_needed_for_heartbeats(api: Api) -> None:
    start = time.monotonic()
    for seq in range(50):
        beat = {"node": "node2", "agent_id": "a", "seq": seq, "sent_at": now_iso()}
        assert api.post("/v1/heartbeats", beat).status_code == 200
    assert api.store.node_row("node2") is None  # buffered in memory until the next pass
    api.controller.reconcile_once()
    row = api.store.node_row("node2")
    assert row is not None and row.hb_seq == 49
    assert time.monotonic() - start < 60


def test_chunked_oversized_body_is_413(api: Api) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(300):
            yield b"x" * 1024

    resp = api.client.post(
        "/v1/reports", content=chunks(), headers={"content-type": "application/json"}
    )
    assert resp.status_code == 413 and nothing_stored(api)


def test_auth_backend_down_is_503_not_401(tmp_path: Path) -> None:
    class Down(ServerAuth):
        def verify(self, method: str, path: str, headers: Any, body: bytes) -> Any:
            raise AuthError("cannot verify MUNGE credential: munged down", 503)

    api = Api(tmp_path)
    client = TestClient(create_app(api.controller, Down(AuthConfig(mode="none"))))
    resp = client.get("/v1/status")
    assert resp.status_code == 503 and error_of(resp)["code"] == "auth_unavailable"
    client.close()
    api.client.close()


def test_job_detail_after_a_requeue(api: Api) -> None:
    from ctl_helpers import job

    api.slurm.jobs[7] = job(7, state="NODE_FAIL", auto_resume=4)
    api.controller.reconcile_once()
    detail = api.get("/v1/jobs/7").json()
    assert detail["cap"] == 4 and detail["attempts"] == 1 and detail["tracking"] == "requeued"
    assert detail["last_cause"] == "job ended NODE_FAIL"
    assert [a["kind"] for a in detail["actions"]] == ["requeue"]
    assert [e["kind"] for e in detail["events"]] == ["requeue"]
    [listed] = api.get("/v1/jobs").json()
    assert listed["job_id"] == 7 and listed["state"] == "PENDING"


def test_admin_action_in_dry_run_is_recorded_not_applied(tmp_path: Path) -> None:
    api = Api(tmp_path)
    api.controller.config = api.controller.executor.config = config(
        policy={"dry_run": True}, auth=api.controller.config.auth.model_dump()
    )
    api.controller.reconcile_once()
    resp = api.post("/v1/nodes/node1/actions", {"action": "reboot"}, who="admin")
    assert resp.status_code == 202 and resp.json()["dry_run"] is True
    api.controller.reconcile_once()
    assert api.slurm.calls == []
    api.client.close()


def test_huge_ids_are_4xx(api: Api) -> None:
    assert api.get(f"/v1/jobs/{2**64}").status_code == 422
    assert api.get("/v1/jobs/0").status_code == 422
    assert api.get(f"/v1/events?since={2**64}").status_code == 422
    beat = {"node": "node2", "agent_id": "a", "seq": 2**63, "sent_at": now_iso()}
    assert api.post("/v1/heartbeats", beat).status_code == 422


def test_hangs_and_stragglers_show_in_jobs_and_node_show(api: Api) -> None:
    from ctl_helpers import job

    from hyperpod_agent.controller.store.rows import EventIn, FindingRow

    now = time.time()
    running = job(77, nodes=("node1", "node2"), auto_resume=None)
    api.controller.jobs = [running]
    api.controller.nodes = dict(api.slurm.nodes)
    hang = FindingRow(0, "hang", 77, 0, "", 120, "job 77 hung: ...", now)
    slow = FindingRow(0, "straggler", 77, 0, "node2", -1, "node2 straggles in job 77", now)
    for f in (hang, slow):
        assert api.store.add_finding(f, EventIn(f.kind, f.detail, f.node or None, 77))
    assert not api.store.add_finding(hang, EventIn("hang", "again", None, 77))  # once
    [listed] = api.get("/v1/jobs").json()
    assert (listed["job_id"], listed["tracking"]) == (77, "progress")
    assert [f["kind"] for f in listed["findings"]] == ["straggler", "hang"]
    shown = api.get("/v1/nodes/node2").json()
    assert [f["detail"] for f in shown["findings"]] == ["node2 straggles in job 77"]


def test_events_of_one_job(api: Api) -> None:
    api.store.add_event("requeue", "requeue job 7", 1.0, job_id=7)
    api.store.add_event("requeue", "requeue job 8", 2.0, job_id=8)
    assert [e["message"] for e in api.get("/v1/events?job=7").json()] == ["requeue job 7"]
    assert api.get("/v1/events?job=0").status_code == 422
