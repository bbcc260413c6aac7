"""Two controllers on one PostgreSQL database sharing one (in-memory) Slurm: only the
leader acts, a deposed leader writes nothing, and a new leader finishes what the old
one left open, exactly once."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import FakeSlurm, cluster
from ha_helpers import TTL, Member
from test_service import report

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*httpx2.*")
    from fastapi.testclient import TestClient

from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.api.app import create_app
from hyperpod_agent.controller.api.models import ERROR_CODES
from hyperpod_agent.controller.store.lease import LeaseLost
from hyperpod_agent.controller.store.url import PostgresLocation

pytestmark = pytest.mark.pg
SLURM_ACTIONS = {"drain", "resume", "reboot", "requeue", "cancel", "node"}


class Crash(BaseException):  # a real crash is os._exit: nothing catches it
    """The leader dies between committing an intent and applying it."""


@pytest.fixture
def slurm() -> FakeSlurm:
    return FakeSlurm(cluster(10))


@pytest.fixture
def members(pg_location: PostgresLocation, slurm: FakeSlurm) -> Iterator[list[Member]]:
    made = [Member(pg_location, "ctl-a:8787", slurm), Member(pg_location, "ctl-b:8787", slurm)]
    yield made
    for m in made:
        m.close()


def lease_lost_passes() -> float:
    return float(metrics.PASSES.labels("lease_lost")._value.get())  # type: ignore[attr-defined]


def test_only_the_leader_calls_slurm(members: list[Member], slurm: FakeSlurm) -> None:
    a, b = members
    assert a.leadership.tick() and not b.leadership.tick()
    for m in (a, b):  # a report reaches either; both store it in the shared database
        m.controller.ingest_report(report("node2", 1 if m is a else 2, m.clock.t, faulty=True))
    assert a.controller.reconcile_once() is not None
    assert b.controller.reconcile_once() is None
    assert b.slurm.calls == []
    assert "list_nodes" in a.slurm.calls and "reboot" in a.slurm.calls
    assert [c[0] for c in slurm.calls] == ["reboot"]
    assert (a.controller.role(), b.controller.role()) == ("leader", "standby")


def test_a_standby_flushes_heartbeats_into_the_shared_store(members: list[Member]) -> None:
    from hyperpod_agent.controller.ingest import Heartbeat

    a, b = members
    assert a.leadership.tick() and not b.leadership.tick()
    b.controller.ingest_heartbeat(Heartbeat("node4", "agent-4", 3, b.clock.t))
    b.controller.reconcile_once()
    row = a.store.node_row("node4")
    assert row is not None and row.hb_seq == 3 and row.heartbeat_at == b.clock.t
    assert b.slurm.calls == []


def test_the_standby_takes_over_and_finishes_an_open_intent_once(
    members: list[Member], slurm: FakeSlurm
) -> None:
    a, b = members

    def crash(point: str) -> None:
        if point.startswith("intent:"):
            raise Crash(point)

    a.controller.executor._crash_hook = crash
    assert a.leadership.tick() and not b.leadership.tick()
    a.controller.ingest_report(report("node2", 1, a.clock.t, faulty=True))
    with pytest.raises(Crash):
        a.controller.reconcile_once()  # the intent is committed, Slurm untouched
    (intent,) = a.store.open_actions()
    assert (intent.kind, intent.node, slurm.calls) == ("reboot", "node2", [])
    # a dies: it renews no more. b's clock reaches the end of a's lease.
    b.clock.t += TTL
    assert b.leadership.tick()
    b.controller.reconcile_once()
    b.controller.reconcile_once()
    assert [c[:2] for c in slurm.calls] == [("reboot", "node2")]
    done = b.store.action(intent.id)
    assert done is not None and done.state == "done"
    assert b.store.open_actions() == []
    # a, back with its old clock, knows it no longer leads: it touches nothing.
    a.slurm.calls.clear()
    a.clock.t += TTL
    assert not a.leadership.tick()
    assert a.controller.reconcile_once() is None and a.slurm.calls == []


def test_a_deposed_leaders_intent_is_refused_and_the_pass_ends(
    members: list[Member], slurm: FakeSlurm
) -> None:
    a, b = members
    assert a.leadership.tick()
    old = a.leadership.lease()
    assert old is not None
    # b's clock is ahead (a paused, or skewed): it sees a's lease expired and takes it,
    # while a, by its own clock, still leads.
    b.clock.t += TTL
    assert b.leadership.tick()
    assert a.leadership.is_leader()
    before = lease_lost_passes()
    a.controller.ingest_report(report("node2", 1, a.clock.t, faulty=True))
    assert a.controller.reconcile_once() is None  # the pass ended, the process did not
    assert lease_lost_passes() == before + 1
    assert a.store.open_actions() == [] and a.store.node_actions("node2") == []
    assert not SLURM_ACTIONS & set(a.slurm.calls)
    assert not a.leadership.is_leader()  # it gave up at once
    with pytest.raises(LeaseLost):
        a.store.add_action("drain", "node3", None, "r", "c", a.clock.t, fence=old)
    assert a.store.node_actions("node3") == []
    assert slurm.calls == []


# -- the API of a standby ------------------------------------------------------------
class Client:
    def __init__(self, member: Member, secret: Path) -> None:
        self.auth = AuthConfig.model_validate({"mode": "token", "token_secret_file": str(secret)})
        app = create_app(member.controller, ServerAuth(self.auth))
        self.http = TestClient(app)

    def call(self, method: str, path: str, body: Any = None, who: str = "admin") -> Any:
        import json

        data = b"" if body is None else json.dumps(body).encode()
        headers = ClientAuth(self.auth, None if who == "admin" else who).headers(method, path, data)
        if body is not None:
            headers["content-type"] = "application/json"
        return self.http.request(method, path, content=data or None, headers=headers)


@pytest.fixture
def clients(members: list[Member], tmp_path: Path) -> Iterator[list[Client]]:
    secret = tmp_path / "secret"
    secret.write_text("s" * 48)
    made = [Client(m, secret) for m in members]
    yield made
    for c in made:
        c.http.close()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/nodes/node3/actions", {"action": "drain", "reason": "bad fan"}),
        ("/v1/checks", {"nodes": ["node3"]}),
        ("/v1/jobs/7/ended", {"exit_code": 1}),
    ],
)
def test_a_standby_refuses_admin_writes_naming_the_leader(
    members: list[Member], clients: list[Client], path: str, body: Any
) -> None:
    a, b = members
    assert a.leadership.tick() and not b.leadership.tick()
    a.controller.reconcile_once()
    resp = clients[1].call("POST", path, body)
    assert resp.status_code == ERROR_CODES["not_leader"] == 503, resp.text
    error = resp.json()["error"]
    assert error["code"] == "not_leader" and "ctl-a:8787" in error["message"]
    assert b.store.open_actions() == [] and b.store.open_check_runs() == []
    written = {"admin_request", "job_ended", "deep_check_planned"}
    assert not [e for e in b.store.events() if e.kind in written]


def test_a_standby_serves_reads_and_takes_reports(
    members: list[Member], clients: list[Client]
) -> None:
    from datetime import UTC, datetime

    a, b = members
    assert a.leadership.tick() and not b.leadership.tick()
    beat = {
        "node": "node5",
        "agent_id": "agent-5",
        "seq": 1,
        "sent_at": datetime.fromtimestamp(b.clock.t, UTC).isoformat(),
    }
    assert clients[1].call("POST", "/v1/heartbeats", beat, who="node5").status_code == 200
    rep = report("node6", 1, b.clock.t, faulty=False).model_dump(mode="json")
    assert clients[1].call("POST", "/v1/reports", rep, who="node6").status_code == 200
    assert a.store.node_row("node6") is not None  # in the shared store
    status = clients[1].call("GET", "/v1/status").json()
    assert status["role"] == "standby" and status["this_controller"] == "ctl-b:8787"
    assert status["leader"] == "ctl-a:8787" and status["leader_since"] is not None
    lead = clients[0].call("GET", "/v1/status").json()
    assert (lead["role"], lead["leader"], lead["this_controller"]) == (
        "leader",
        "ctl-a:8787",
        "ctl-a:8787",
    )
    assert lead["leader_since"] == status["leader_since"]
    assert clients[1].call("GET", "/v1/nodes").status_code == 200


def test_the_leader_accepts_admin_writes(members: list[Member], clients: list[Client]) -> None:
    a, b = members
    assert a.leadership.tick() and not b.leadership.tick()
    a.controller.reconcile_once()
    resp = clients[0].call("POST", "/v1/nodes/node3/actions", {"action": "drain"})
    assert resp.status_code == 202, resp.text
