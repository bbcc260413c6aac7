"""``[policy] mode = "observe"``: every automatic action is decided, logged and counted
as "would have" (event ``would_have``, ``hyperpod_would_have_total``) and nothing in
Slurm changes; the gate refuses whatever still gets to it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ctl_helpers import NOW, FakeSlurm, cluster, config
from test_api import Api, report
from test_api_steps import FAILURE, JOB, WATCH

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.actions import Executor
from hyperpod_agent.controller.config import load_config, parse_config
from hyperpod_agent.controller.gate import Gate, Refused
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
from hyperpod_agent.controller.snapshot import Decision, Kind, PlannedAction
from hyperpod_agent.controller.store.facade import Store

REASON = "hyperpod:reboot gpu0 xid79 fell off the bus"
OBSERVE = {"mode": "observe"}


def would(action: str) -> float:
    return float(metrics.WOULD_HAVE.labels(action)._value.get())  # type: ignore[attr-defined]


def reboot(
    name: str = "node2", code: str = "xid79", cause: str = "fell off the bus"
) -> PlannedAction:
    return PlannedAction(
        Kind.REBOOT,
        name,
        REASON,
        f"gpu0 {code}: {cause}",
        urgent=True,
        takes_out=True,
        params={"fault_code": code},
    )


def executor(store: Store, slurm: FakeSlurm, policy: dict[str, object]) -> Executor:
    gate = Gate(slurm, slurm_users=("slurm",))  # type: ignore[arg-type]
    gate.observe = True
    return Executor(store, gate, SparePoolProvider(gate), config(policy=policy))


@pytest.mark.parametrize("policy", [OBSERVE, {"dry_run": True}], ids=["mode", "old dry_run"])
def test_each_decision_is_a_would_have_once_while_it_stands(
    store: Store, policy: dict[str, object]
) -> None:
    slurm = FakeSlurm(cluster(4))
    ex = executor(store, slurm, policy)
    before = (would("reboot"), would("requeue"), would("deep_check"))
    check = PlannedAction(
        Kind.CHECK,
        "node3",
        "",
        "back from its reboot",
        params={"nodes": ["node3"], "level": "quick", "purpose": "reentry", "prior": {}},
    )
    requeue = PlannedAction(Kind.REQUEUE, None, "", "job failed on node2", job_id=7)
    for _ in range(3):  # the same decision, pass after pass
        ex.execute(Decision([reboot(), requeue, check]), slurm.nodes, [], NOW)
    assert slurm.calls == [] and store.open_actions() == []
    events = [e for e in store.events() if e.kind == "would_have"]
    assert [e.message.split(":")[1].strip() for e in events] == [
        "would reboot node2",
        "would requeue job 7",
        "would deep_check node3",
    ]
    assert events[0].node == "node2" and events[1].job_id == 7
    after = (would("reboot"), would("requeue"), would("deep_check"))
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1]
    ex.execute(Decision([]), slurm.nodes, [], NOW)  # the fault cleared for a pass
    ex.execute(Decision([reboot()]), slurm.nodes, [], NOW)  # and came back: said again
    ex.execute(Decision([reboot(code="xid48")]), slurm.nodes, [], NOW)  # another fault
    # the same decision worded anew (a hang's cause counts its idle seconds): not again
    ex.execute(Decision([reboot(code="xid48", cause="still")]), slurm.nodes, [], NOW)
    assert sum(e.kind == "would_have" for e in store.events()) == 5
    assert slurm.calls == []


def test_the_gate_refuses_every_change_in_observe_mode(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    gate = Gate(slurm, slurm_users=("slurm",))  # type: ignore[arg-type]
    gate.observe = True
    before = metrics.GATE_CALLS.labels("drain", "would_have")._value.get()  # type: ignore[attr-defined]
    calls = [
        lambda: gate.drain("node2", REASON),
        lambda: gate.resume("node2"),
        lambda: gate.reboot("node2", REASON),
        lambda: gate.requeue(7),
        lambda: gate.cancel(7),
        lambda: gate.shrink_job(7, ["node1"]),
        lambda: gate.delete_reservation("hyperpod_check_1"),
    ]
    for call in calls:
        with pytest.raises(Refused, match="observe"):
            call()
    assert slurm.calls == []
    assert metrics.GATE_CALLS.labels("drain", "would_have")._value.get() == before + 1  # type: ignore[attr-defined]
    assert [n.name for n in gate.list_nodes()] == sorted(slurm.nodes)  # reads still work


def test_mode_is_in_the_config_and_the_old_key_still_means_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert parse_config("", tmp_path).policy.observe is False
    assert parse_config('[policy]\nmode = "observe"\n', tmp_path).policy.observe is True
    path = tmp_path / "controller.toml"
    path.write_text("[policy]\ndry_run = true\n")
    assert load_config(path).policy.observe is True
    assert 'dry_run is deprecated: write mode = "observe"' in caplog.text
    with pytest.raises(Exception, match="mode"):
        parse_config('[policy]\nmode = "watch"\n', tmp_path)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    a.controller.config = a.controller.executor.config = config(
        policy=OBSERVE, auth=a.controller.config.auth.model_dump()
    )
    a.controller.steps.config = a.controller.config
    a.controller.gate.observe = True
    for name in ("node1", "node2", "node3"):
        a.slurm.nodes[name] = replace(a.slurm.nodes[name], state="ALLOCATED")
    started = datetime.fromtimestamp(time.time() - 3600, UTC)
    a.slurm.jobs[12] = replace(JOB, start_time=started)
    assert a.post("/v1/reports", report("node5", faulty=False), who="node5").status_code == 200
    a.controller.reconcile_once()
    yield a
    a.client.close()


def test_a_step_retry_is_a_would_have_and_the_step_is_answered_fail(api: Api) -> None:
    before = would("step_retry")
    assert api.post("/v1/reports", report("node2"), who="node2").status_code == 200
    resp = api.post("/v1/steps/retry", FAILURE, who="node1")
    assert resp.status_code in (200, 202), resp.text
    out = resp.json()
    assert (out["decision"], out["done"], out["id"]) == ("FAIL", True, None)
    assert 'mode = "observe": would RETRYSTEP' in out["cause"]
    assert api.controller.store.open_step_retries() == []
    [event] = [e for e in api.controller.store.events() if e.kind == "would_have"][-1:]
    assert "would step_retry job 12 step 0 on node5 for node2" in event.message
    assert would("step_retry") == before + 1
    for _ in range(2):
        api.controller.reconcile_once()  # the pass decides the reboot: would-have only
    assert api.slurm.calls == []
    status = api.get("/v1/status", who="admin").json()
    assert (status["mode"], status["dry_run"]) == ("observe", True)


def test_switching_mode_on_reload_is_an_event(tmp_path: Path) -> None:
    api = Api(tmp_path)
    try:
        path = tmp_path / "reload.toml"
        path.write_text('[policy]\nmode = "observe"\n')
        api.controller.config_path = path
        api.controller._reload_config()
        assert api.controller.gate.observe and api.controller.config.policy.observe
        assert any(
            e.kind == "mode" and "observe" in e.message for e in api.controller.store.events()
        )
    finally:
        api.client.close()


def test_a_watched_step_is_not_ended_only_told(api: Api) -> None:
    """Ending the step would fail the job: in observe mode it runs on, and the end it
    would have had is a would_have (once)."""
    before = would("step_end")
    assert api.post("/v1/reports", report("node2"), who="node2").status_code == 200
    for _ in range(2):
        out = api.post("/v1/steps/watch", WATCH, who="node1").json()
        assert out["end"] is False and "gpu0 xid79 on node2" in out["cause"]
    [told] = [e for e in api.controller.store.events() if e.kind == "would_have"]
    assert "would step_end job 12 step srun-41" in told.message and told.node == "node2"
    assert would("step_end") == before + 1
