"""Every way back into service passes the re-entry gate: a node that came back from
its replacement and a node an admin resumes are drained under ``hyperpod:check`` for
the gate (tests/unit/controller/test_deep_check_gates.py: which then checks and
resumes it), unless the gate is off or the admin said ``--no-check``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import NOW, FakeSlurm, cluster, config, node, ts
from test_api import Api

from hyperpod_agent.controller.actions import Executor
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.intents import already_applied
from hyperpod_agent.controller.providers.command import CommandProvider
from hyperpod_agent.controller.snapshot import Decision, Kind, PlannedAction
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import ActionRow
from hyperpod_agent.reasons import Owner, Verb, owner_of, parse_reason

SUITE = {"suite": "/etc/hyperpod/deep-checks.toml"}  # gates on by default
REPLACE = "hyperpod:replace gpu0 xid54 x"
HELD = "hyperpod:hold deep-check dcgm memory failed on GPU 3"


# --- a replacement that completed ---------------------------------------------------


def replaced(store: Store, tmp_path: Path, cfg: ControllerConfig) -> tuple[FakeSlurm, int]:
    """node3 replaced through a command; the machine came back (slurmd restarted)."""
    exe = tmp_path / "replace-node"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    slurm = FakeSlurm(cluster(4))
    ex = Executor(store, slurm, CommandProvider(slurm, [str(exe)], timeout_s=30), cfg)
    [aid] = ex.execute(
        Decision([PlannedAction(Kind.REPLACE, "node3", REPLACE, "c")]), slurm.nodes, [], NOW
    )
    slurm.nodes["node3"] = replace(slurm.nodes["node3"], slurmd_start_time=ts(NOW + 5))
    ex.process_open(slurm.nodes, [], NOW + 6)
    return slurm, aid


def test_a_replaced_node_that_came_back_waits_for_its_check(store: Store, tmp_path: Path) -> None:
    slurm, aid = replaced(store, tmp_path, config(deep_checks=SUITE))
    row = store.action(aid)
    assert row is not None and row.state == "done"
    assert slurm.names("resume") == []
    back = slurm.nodes["node3"]
    ours = parse_reason(back.reason)
    assert back.drained and ours is not None and ours.verb is Verb.CHECK
    assert back.reason == "hyperpod:check replace back replaced for gpu0 xid54"
    assert owner_of(back, ("slurm",)) is Owner.US
    [event] = [e for e in store.events() if e.kind == "replace"]
    assert "held for a deep check before it takes work" in event.message


@pytest.mark.parametrize("deep", [{}, {**SUITE, "gate_reentry": False}])
def test_without_the_gate_a_replaced_node_is_resumed(
    store: Store, tmp_path: Path, deep: dict[str, object]
) -> None:
    slurm, _ = replaced(store, tmp_path, config(deep_checks=deep))
    assert slurm.names("resume") == ["node3"] and not slurm.nodes["node3"].drained


def test_a_node_somebody_took_during_its_replacement_is_left_to_them(
    store: Store, tmp_path: Path
) -> None:
    exe = tmp_path / "replace-node"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    slurm = FakeSlurm(cluster(4))
    ex = Executor(
        store, slurm, CommandProvider(slurm, [str(exe)], timeout_s=30), config(deep_checks=SUITE)
    )
    [aid] = ex.execute(
        Decision([PlannedAction(Kind.REPLACE, "node3", REPLACE, "c")]), slurm.nodes, [], NOW
    )
    mine = "RMA 1234 -- alice"
    slurm.nodes["node3"] = replace(
        slurm.nodes["node3"], slurmd_start_time=ts(NOW + 5), reason=mine, reason_user="alice"
    )
    ex.process_open(slurm.nodes, [], NOW + 6)
    assert slurm.nodes["node3"].reason == mine
    row = store.action(aid)
    assert row is not None and row.state == "done"


# --- an admin's resume ----------------------------------------------------------------


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path, deep_checks=SUITE)
    a.slurm.nodes["node2"] = node("node2", flags=("DRAIN",), reason=HELD, reason_time=NOW - 100)
    a.controller.reconcile_once()
    yield a
    a.client.close()


def resume(api: Api, name: str = "node2", **extra: Any) -> dict[str, Any]:
    resp = api.post(
        f"/v1/nodes/{name}/actions", {"action": "resume", "reason": "fixed", **extra}, who="admin"
    )
    assert resp.status_code == 202, resp.text
    return dict(resp.json())


def request_event(api: Api) -> str:
    [event] = [e for e in api.store.events() if e.kind == "admin_request"]
    return event.message


def test_an_admin_resume_hands_the_node_to_the_gate(gated: Api) -> None:
    accepted = resume(gated)
    assert accepted["reason"] == "hyperpod:check admin resume fixed"
    assert "(after a deep check)" in request_event(gated)
    gated.controller.reconcile_once()
    n = gated.slurm.nodes["node2"]
    assert n.drained and n.reason == "hyperpod:check admin resume fixed"
    assert gated.slurm.names("resume") == []
    row = gated.store.action(accepted["action_id"])
    assert row is not None and row.state == "done" and row.params["deep_check"] is True


def test_no_check_resumes_at_once_and_says_so(gated: Api) -> None:
    accepted = resume(gated, check=False)
    assert accepted["reason"] == ""
    assert "(no deep check: --no-check)" in request_event(gated)
    gated.controller.reconcile_once()
    assert not gated.slurm.nodes["node2"].drained and gated.slurm.names("resume") == ["node2"]


def test_an_older_client_without_the_field_gets_the_check(gated: Api) -> None:
    resp = gated.post("/v1/nodes/node2/actions", {"action": "resume", "reason": "x"}, who="admin")
    assert resp.status_code == 202 and resp.json()["reason"].startswith("hyperpod:check admin")


def test_check_is_refused_on_other_actions(gated: Api) -> None:
    resp = gated.post("/v1/nodes/node2/actions", {"action": "drain", "check": False}, who="admin")
    assert resp.status_code == 422 and "resume only" in resp.text
    assert gated.store.open_actions() == []


def test_with_the_gate_off_an_admin_resume_resumes(tmp_path: Path) -> None:
    api = Api(tmp_path, deep_checks={**SUITE, "gate_reentry": False})
    try:
        api.slurm.nodes["node2"] = node("node2", flags=("DRAIN",), reason=HELD)
        api.controller.reconcile_once()
        assert resume(api)["reason"] == ""
        assert "(no deep check: the re-entry gate is off)" in request_event(api)
        api.controller.reconcile_once()
        assert not api.slurm.nodes["node2"].drained
    finally:
        api.client.close()


def test_resuming_a_node_in_service_drains_nothing(gated: Api) -> None:
    resume(gated, "node1")
    assert "(in service already: nothing to check)" in request_event(gated)
    gated.controller.reconcile_once()
    assert not gated.slurm.nodes["node1"].drained and gated.slurm.names("drain") == []


def test_a_human_drain_since_the_request_is_kept(gated: Api) -> None:
    accepted = resume(gated)
    mine = "keep out -- bob"
    gated.slurm.nodes["node2"] = node("node2", flags=("DRAIN",), reason=mine)
    gated.controller.reconcile_once()
    assert gated.slurm.nodes["node2"].reason == mine
    row = gated.store.action(accepted["action_id"])
    assert row is not None and row.state == "abandoned"


def test_a_gated_resume_is_applied_once_the_node_waits_under_its_reason() -> None:
    """After a crash between the drain and its record, the intent is found applied."""
    reason = "hyperpod:check admin resume fixed"
    params = {"deep_check": True, "seen_reason": HELD}
    row = ActionRow(1, "resume", "node2", None, reason, "c", params, "intent", 0, NOW, NOW, 0.0, "")
    waiting = node("node2", flags=("DRAIN",), reason=reason)
    held = node("node2", flags=("DRAIN",), reason=HELD)
    assert already_applied(row, {"node2": waiting}, {})
    assert not already_applied(row, {"node2": held}, {})
    assert already_applied(row, {"node2": node("node2")}, {})  # checked and resumed since
    plain = replace(row, reason="", params={})
    assert not already_applied(plain, {"node2": held}, {})
