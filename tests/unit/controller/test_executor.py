"""The executor with an in-memory Slurm: intent log, retries, recovery, dry-run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from ctl_helpers import NOW, FakeSlurm, cluster, config, job, node, ts
from store_helpers import StoreTarget

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.actions import Executor
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.providers.base import ReplaceStatus
from hyperpod_agent.controller.providers.command import CommandProvider
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
from hyperpod_agent.controller.snapshot import Decision, Kind, PlannedAction
from hyperpod_agent.controller.store.facade import Store

REASON = "hyperpod:reset gpu0 xid46 boom"


class Crash(BaseException):  # a real crash is os._exit: nothing catches it
    """Stands in for the process dying right after the intent commit."""


def crash(point: str = "") -> None:
    raise Crash


def make(
    store: Store, slurm: FakeSlurm, cfg: ControllerConfig | None = None, **kw: object
) -> Executor:
    return Executor(store, slurm, SparePoolProvider(slurm), cfg or config(), **kw)  # type: ignore[arg-type]


def drain(name: str = "node2", reason: str = REASON, **kw: object) -> PlannedAction:
    return PlannedAction(Kind.DRAIN, name, reason, "gpu0 xid46: boom", **kw)  # type: ignore[arg-type]


def nodes_of(slurm: FakeSlurm) -> dict[str, object]:
    return dict(slurm.nodes)


def test_intent_apply_done_and_event(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    ex = make(store, slurm)
    [aid] = ex.execute(
        Decision([drain(params={"fault_first_seen": NOW - 2})]), slurm.nodes, [], NOW
    )
    assert slurm.calls == [("drain", "node2", REASON)]
    row = store.action(aid)
    assert row is not None and (row.state, row.attempts) == ("done", 1)
    [event] = store.events()
    assert event.kind == "drain" and event.node == "node2" and "gpu0 xid46" in event.cause
    assert REASON in event.message


def test_fault_to_drain_is_observed(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    before = metrics.FAULT_TO_DRAIN._sum.get()  # type: ignore[attr-defined]
    make(store, slurm).execute(
        Decision([drain(params={"fault_first_seen": NOW - 2})]), slurm.nodes, [], NOW
    )
    assert metrics.FAULT_TO_DRAIN._sum.get() - before == pytest.approx(2.0)  # type: ignore[attr-defined]


def test_slurm_error_is_retried_with_backoff_then_fails(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    slurm.fail_next["drain"] = 10
    cfg = config(policy={"max_attempts": 3, "retry_backoff_s": 5})
    ex = make(store, slurm, cfg)
    [aid] = ex.execute(Decision([drain()]), slurm.nodes, [], NOW)
    row = store.action(aid)
    assert row is not None and (row.state, row.attempts, row.next_attempt_at) == (
        "intent",
        1,
        NOW + 5,
    )
    ex.process_open(slurm.nodes, [], NOW + 1)  # not due yet
    assert len(slurm.calls) == 1
    ex.process_open(slurm.nodes, [], NOW + 5)
    row = store.action(aid)
    assert row is not None and (row.attempts, row.next_attempt_at) == (2, NOW + 15)
    ex.process_open(slurm.nodes, [], NOW + 15)
    row = store.action(aid)
    assert row is not None and row.state == "failed" and "Unexpected error" in row.error
    assert store.events()[-1].kind == "action_failed"
    ex.process_open(slurm.nodes, [], NOW + 100)
    assert len(slurm.calls) == 3


def test_retry_succeeds(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    slurm.fail_next["drain"] = 1
    ex = make(store, slurm)
    [aid] = ex.execute(Decision([drain()]), slurm.nodes, [], NOW)
    ex.process_open(slurm.nodes, [], NOW + 60)
    row = store.action(aid)
    assert row is not None and row.state == "done" and slurm.nodes["node2"].drained


def test_crash_after_intent_then_restart_applies_exactly_once(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    with pytest.raises(Crash):
        make(store, slurm, crash_hook=crash).execute(Decision([drain()]), slurm.nodes, [], NOW)
    assert slurm.calls == [] and len(store.open_actions()) == 1
    restarted = make(store, slurm)
    restarted.process_open(slurm.nodes, [], NOW + 1)
    restarted.process_open(slurm.nodes, [], NOW + 2)
    assert slurm.calls == [("drain", "node2", REASON)]
    assert store.open_actions() == []


def test_restart_finds_intent_already_applied(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    with pytest.raises(Crash):
        make(store, slurm, crash_hook=crash).execute(Decision([drain()]), slurm.nodes, [], NOW)
    slurm.drain("node2", REASON)  # applied just before the crash
    slurm.calls.clear()
    make(store, slurm).process_open(slurm.nodes, [], NOW + 1)
    assert slurm.calls == [] and store.open_actions() == []
    assert "found already applied" in store.events()[-1].message


@pytest.mark.parametrize(
    ("planned", "applied_state"),
    [
        (PlannedAction(Kind.RESUME, "node2", "", "healthy"), lambda s: None),
        (
            PlannedAction(Kind.REBOOT, "node2", "hyperpod:reboot gpu0 xid79 x", "c"),
            lambda s: s.reboot("node2", "hyperpod:reboot gpu0 xid79 x"),
        ),
        (
            PlannedAction(
                Kind.REQUEUE, None, "", "NODE_FAIL", job_id=7, params={"restart_count": 0, "cap": 3}
            ),
            lambda s: s.requeue(7),
        ),
    ],
)
def test_recovery_per_kind(
    store: Store,
    planned: PlannedAction,
    applied_state: object,
    new_target: Callable[[], StoreTarget],
    open_store: Callable[[StoreTarget], Store],
) -> None:
    nodes = cluster(4)
    if planned.kind is Kind.RESUME:
        nodes["node2"] = node("node2", flags=("DRAIN",), reason=REASON)
    slurm = FakeSlurm(nodes, [job(7, state="NODE_FAIL")])
    with pytest.raises(Crash):
        make(store, slurm, crash_hook=crash).execute(
            Decision([planned]), slurm.nodes, slurm.list_jobs(), NOW
        )
    # Not applied: the restart applies it once.
    make(store, slurm).process_open(slurm.nodes, slurm.list_jobs(), NOW + 1)
    assert len(slurm.calls) == 1 and store.open_actions() == []
    # Applied before the crash: the restart only marks it done.
    slurm2 = FakeSlurm(nodes, [job(7, state="NODE_FAIL")])
    store2 = open_store(new_target())
    with pytest.raises(Crash):
        make(store2, slurm2, crash_hook=crash).execute(
            Decision([planned]), slurm2.nodes, slurm2.list_jobs(), NOW
        )
    if planned.kind is Kind.RESUME:
        slurm2.resume("node2")
    else:
        applied_state(slurm2)  # type: ignore[operator]
    slurm2.calls.clear()
    make(store2, slurm2).process_open(slurm2.nodes, slurm2.list_jobs(), NOW + 1)
    assert slurm2.calls == [] and store2.open_actions() == []


def test_requeue_updates_the_tracked_job(store: Store) -> None:
    slurm = FakeSlurm(cluster(4), [job(7, state="NODE_FAIL", restart_count=2)])
    pa = PlannedAction(
        Kind.REQUEUE,
        None,
        "",
        "job ended NODE_FAIL",
        job_id=7,
        params={"restart_count": 2, "cap": 5},
    )
    make(store, slurm).execute(Decision([pa]), slurm.nodes, slurm.list_jobs(), NOW)
    tracked = store.job(7)
    assert tracked is not None
    assert (tracked.attempts, tracked.acted_restart_count, tracked.state, tracked.cap) == (
        1,
        2,
        "requeued",
        5,
    )
    assert slurm.jobs[7].state == "PENDING"


def test_exhaust_marks_job_and_says_why(store: Store) -> None:
    slurm = FakeSlurm(cluster(2))
    pa = PlannedAction(
        Kind.EXHAUST, None, "", "NODE_FAIL; retry budget spent (3/3)", job_id=7, params={"cap": 3}
    )
    make(store, slurm).execute(Decision([pa]), slurm.nodes, [], NOW)
    tracked = store.job(7)
    assert tracked is not None and tracked.state == "exhausted"
    [event] = store.events()
    assert event.kind == "budget_spent" and "budget spent" in event.message
    assert slurm.calls == []


def test_cooldown_damps_repeated_resume(store: Store) -> None:
    nodes = cluster(4)
    nodes["node2"] = node("node2", flags=("DRAIN",), reason=REASON)
    slurm = FakeSlurm(nodes)
    ex = make(store, slurm, config(policy={"cooldown_s": 60}))
    resume = PlannedAction(Kind.RESUME, "node2", "", "healthy")
    ex.execute(Decision([resume]), slurm.nodes, [], NOW)
    slurm.drain("node2", REASON)
    ex.execute(Decision([resume]), slurm.nodes, [], NOW + 30)
    assert slurm.names("resume") == ["node2"]
    ex.execute(Decision([resume]), slurm.nodes, [], NOW + 61)
    assert slurm.names("resume") == ["node2", "node2"]


def test_drains_are_never_delayed_by_cooldown(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    ex = make(store, slurm, config(policy={"cooldown_s": 600}))
    ex.execute(Decision([drain()]), slurm.nodes, [], NOW)
    ex.execute(
        Decision([drain(reason="hyperpod:reset gpu1 xid46 again")]), slurm.nodes, [], NOW + 1
    )
    assert len(slurm.names("drain")) == 2


def spare_cluster() -> dict[str, object]:
    nodes = cluster(4)
    nodes["node5"] = node("node5", flags=("DRAIN",), reason="hyperpod:spare")
    return nodes  # type: ignore[return-value]


def test_spare_pool_replace(store: Store) -> None:
    slurm = FakeSlurm(spare_cluster())  # type: ignore[arg-type]
    ex = make(store, slurm)
    pa = PlannedAction(
        Kind.REPLACE,
        "node3",
        "hyperpod:replace admin request Action:Replace",
        "admin",
        params={"spare": "node5"},  # the spare the policy promised
    )
    [aid] = ex.execute(Decision([pa]), slurm.nodes, [], NOW)
    assert slurm.calls == [("drain", "node3", pa.reason), ("resume", "node5")]
    row = store.action(aid)
    assert row is not None and row.state == "applied" and row.params["spare"] == "node5"
    ex.process_open(slurm.nodes, [], NOW + 1)
    row = store.action(aid)
    assert row is not None and row.state == "done"
    assert slurm.nodes["node3"].drained and not slurm.nodes["node5"].drained


def test_without_a_spare_the_node_is_still_taken_out_and_held(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    why = "no spare ready in partitions main (node5: its agent says faulty)"
    pa = PlannedAction(
        Kind.REPLACE, "node3", "hyperpod:replace gpu0 xid54 x", "c", params={"no_spare": why}
    )
    make(store, slurm).execute(Decision([pa]), slurm.nodes, [], NOW)
    assert slurm.calls == [("drain", "node3", "hyperpod:replace gpu0 xid54 x")]
    assert store.open_actions() == []
    kinds = [e.kind for e in store.events()]
    assert kinds == ["no_replacement", "drain"]
    assert why in store.events()[0].message


def test_spare_pool_retry_keeps_the_chosen_spare(store: Store) -> None:
    nodes = spare_cluster()
    nodes["node6"] = node("node6", flags=("DRAIN",), reason="hyperpod:spare")
    slurm = FakeSlurm(nodes)  # type: ignore[arg-type]
    slurm.fail_next["resume"] = 1
    ex = make(store, slurm)
    pa = PlannedAction(
        Kind.REPLACE, "node3", "hyperpod:replace gpu0 xid54 x", "c", params={"spare": "node5"}
    )
    [aid] = ex.execute(Decision([pa]), slurm.nodes, [], NOW)
    ex.process_open(slurm.nodes, [], NOW + 60)
    assert slurm.names("resume") == ["node5", "node5"]
    assert slurm.names("drain") == ["node3"]  # idempotent: not drained twice
    assert slurm.nodes["node6"].drained


def test_command_provider_waits_for_the_node(store: Store, tmp_path: Path) -> None:
    exe = tmp_path / "replace-node"
    exe.write_text('#!/bin/sh\necho "$1" > "$(dirname "$0")/called"\n')
    exe.chmod(0o755)
    slurm = FakeSlurm(cluster(4))
    provider = CommandProvider(slurm, [str(exe)], timeout_s=30)
    ex = Executor(store, slurm, provider, config())
    pa = PlannedAction(Kind.REPLACE, "node3", "hyperpod:replace gpu0 xid54 x", "c")
    [aid] = ex.execute(Decision([pa]), slurm.nodes, [], NOW)
    assert (tmp_path / "called").read_text().strip() == "node3"
    ex.process_open(slurm.nodes, [], NOW + 1)
    row = store.action(aid)
    assert row is not None and row.state == "applied"
    slurm.nodes["node3"] = replace(slurm.nodes["node3"], slurmd_start_time=ts(NOW + 5))
    ex.process_open(slurm.nodes, [], NOW + 6)
    row = store.action(aid)
    assert row is not None and row.state == "done" and slurm.names("resume") == ["node3"]


def test_command_provider_failure_is_retried_then_failed(store: Store, tmp_path: Path) -> None:
    exe = tmp_path / "replace-node"
    exe.write_text("#!/bin/sh\necho 'no capacity' >&2\nexit 3\n")
    exe.chmod(0o755)
    slurm = FakeSlurm(cluster(4))
    provider = CommandProvider(slurm, [str(exe)], timeout_s=30)
    ex = Executor(store, slurm, provider, config(policy={"max_attempts": 1}))
    pa = PlannedAction(Kind.REPLACE, "node3", "hyperpod:replace gpu0 xid54 x", "c")
    [aid] = ex.execute(Decision([pa]), slurm.nodes, [], NOW)
    row = store.action(aid)
    assert row is not None and row.state == "failed" and "exit 3: no capacity" in row.error


def test_command_provider_times_out(tmp_path: Path) -> None:
    slurm = FakeSlurm(cluster(2))
    provider = CommandProvider(slurm, ["/bin/true"], timeout_s=30)
    handle = {"node": "node1", "started_at": NOW, "deadline": NOW + 30}
    assert provider.poll(handle, slurm.nodes, NOW + 10) is ReplaceStatus.PENDING
    assert provider.poll(handle, slurm.nodes, NOW + 31) is ReplaceStatus.FAILED


def test_with_the_reentry_gate_a_reboot_keeps_the_node_drained(store: Store) -> None:
    """``scontrol reboot ASAP nextstate=resume`` would put the node back in service by
    itself after the boot; with the gate it is drained and rebooted with no next
    state, so it stays out until it passes its deep checks."""
    reason = "hyperpod:reboot gpu3 xid79 x"
    reboot = PlannedAction(Kind.REBOOT, "node2", reason, "xid79")
    slurm = FakeSlurm(cluster(4))
    make(store, slurm).execute(Decision([reboot]), slurm.nodes, [], NOW)
    assert slurm.calls == [("reboot", "node2", reason)]
    gated = config(deep_checks={"suite": "/etc/hyperpod/deep-checks.toml", "gate_reentry": True})
    slurm = FakeSlurm(cluster(4))
    calls: list[tuple[object, ...]] = []
    slurm.reboot = lambda n, r, asap=True, next_state="resume": calls.append((n, asap, next_state))  # type: ignore[method-assign]
    make(store, slurm, gated).execute(Decision([reboot]), slurm.nodes, [], NOW + 100)
    assert slurm.calls == [("drain", "node2", reason)]
    assert calls == [("node2", False, "")]


def test_a_check_is_recorded_as_a_run_not_sent_to_slurm(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    params = {"nodes": ["node2"], "level": "quick", "purpose": "reentry", "prior": {"node2": "r"}}
    check = PlannedAction(Kind.CHECK, "node2", "", "deep check before resuming", params=params)
    make(store, slurm).execute(Decision([check]), slurm.nodes, [], NOW)
    assert slurm.calls == []
    [run] = store.open_check_runs()
    assert (run.nodes, run.purpose, run.phase, run.prior) == (
        ("node2",),
        "reentry",
        "reserve",
        {"node2": "r"},
    )
    assert [e.kind for e in store.events()] == ["deep_check_planned"]
