"""The store's behaviour, on SQLite and on PostgreSQL alike (the ``store`` and
``store_target`` fixtures in conftest.py run each test on both)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from store_helpers import INTEGRITY_ERRORS, OPEN_IN_CHILD, StoreTarget, target_argv

from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import FaultIn, TrackedJob
from hyperpod_agent.controller.store.schema import MIGRATIONS
from hyperpod_agent.errors import ConfigError

OpenStore = Callable[[StoreTarget], Store]

F0 = FaultIn("gpu0", "xid79", "FAIL", "REBOOT", True, "lost")
F1 = FaultIn("ib0", "link_down", "FAIL", "RESET", False, "")


def test_fresh_database_is_at_the_latest_version(store: Store) -> None:
    assert store.schema_version() == len(MIGRATIONS)
    if store.dialect.name == "sqlite":
        assert store._query("PRAGMA journal_mode")[0][0] == "wal"


def test_every_migration_applies_one_at_a_time_keeping_the_data(
    store_target: StoreTarget,
) -> None:
    for version in range(1, len(MIGRATIONS) + 1):
        step = Store(store_target, migrations=MIGRATIONS[:version])
        try:
            assert step.schema_version() == version
            if version == 1:
                with step._tx() as db:
                    db.execute("INSERT INTO nodes (name, verdict) VALUES ('node1', 'healthy')")
        finally:
            step.close()
    store = Store(store_target)
    try:
        row = store.node_row("node1")
        assert row is not None and row.verdict == "healthy" and row.jobs_opted_in == "{}"
    finally:
        store.close()


def test_migrate_reports_the_version_and_does_nothing_more_when_current(
    store_target: StoreTarget, open_store: OpenStore
) -> None:
    old = Store(store_target, migrations=MIGRATIONS[:1])
    old.close()
    store = Store(store_target, migrate=False)
    try:
        assert store.schema_version() == 1
        assert store.migrate() == len(MIGRATIONS)
        assert store.migrate() == len(MIGRATIONS)
    finally:
        store.close()


def test_refuses_a_newer_schema_changing_nothing(
    store_target: StoreTarget, open_store: OpenStore
) -> None:
    store = open_store(store_target)
    with store._tx() as db:
        db.execute("UPDATE schema_version SET version=99")
    store.close()
    with pytest.raises(ConfigError, match="schema version 99 is newer than this controller"):
        Store(store_target)
    unchanged = Store(store_target, migrate=False)
    try:
        assert unchanged.schema_version() == 99
    finally:
        unchanged.close()


def test_unusable_path_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot open state database"):
        Store(blocker / "sub" / "state.db")


def test_report_opens_updates_and_closes_faults(store: Store) -> None:
    opened, closed = store.record_report("node2", "a", 1, 100.0, "faulty", "{}", [F0, F1], 101.0)
    assert {f.code for f in opened} == {"xid79", "link_down"} and closed == []
    opened, closed = store.record_report("node2", "a", 2, 110.0, "faulty", "{}", [F0], 111.0)
    assert opened == [] and [f.code for f in closed] == ["link_down"]
    [still] = store.open_faults()
    assert (still.code, still.count, still.first_seen, still.last_seen) == ("xid79", 2, 100, 110)
    store.record_report("node2", "a", 3, 120.0, "healthy", "{}", [], 121.0)
    assert store.open_faults() == []
    history = store.faults_since(0)
    assert len(history) == 2 and all(f.closed_at is not None for f in history)
    row = store.node_row("node2")
    assert row is not None and (row.agent_id, row.seq, row.verdict) == ("a", 3, "healthy")


def test_the_same_fault_again_is_a_new_occurrence(store: Store) -> None:
    store.record_report("node2", "a", 1, 100.0, "faulty", "{}", [F0], 100.0)
    store.record_report("node2", "a", 2, 110.0, "healthy", "{}", [], 110.0)
    opened, _ = store.record_report("node2", "a", 3, 120.0, "faulty", "{}", [F0], 120.0)
    assert len(opened) == 1 and len(store.faults_since(0)) == 2


def test_burst_peers_are_closed_faults_near_an_open_one_of_the_same_code(
    store: Store,
) -> None:
    store.record_report("node1", "a", 1, 100.0, "faulty", "{}", [F0, F1], 100.0)
    store.record_report("node1", "a", 2, 105.0, "healthy", "{}", [], 105.0)  # both clear
    store.record_report("node2", "b", 1, 102.0, "faulty", "{}", [F0], 102.0)
    store.record_report("node3", "c", 1, 500.0, "faulty", "{}", [F1], 500.0)  # far apart
    assert [(f.node, f.code) for f in store.burst_peers(3.0)] == [("node1", "xid79")]
    assert store.burst_peers(1.0) == []


def test_heartbeats_never_move_backwards(store: Store) -> None:
    store.record_heartbeats({"node1": ("a", 5, 200.0)})
    store.record_heartbeats({"node1": ("a", 6, 150.0)})
    row = store.node_row("node1")
    assert row is not None and row.heartbeat_at == 200.0 and row.hb_seq == 6


def test_actions_lifecycle(store: Store) -> None:
    aid = store.add_action("drain", "node2", None, "hyperpod:reset gpu0 x", "cause", 10.0, {"k": 1})
    [row] = store.open_actions()
    assert (row.id, row.state, row.params) == (aid, "intent", {"k": 1})
    store.update_action(aid, "intent", 11.0, attempts=1, error="busy", next_attempt_at=20.0)
    row2 = store.action(aid)
    assert row2 is not None and (row2.attempts, row2.error, row2.next_attempt_at) == (1, "busy", 20)
    store.update_action(aid, "done", 12.0, attempts=2)
    assert store.open_actions() == []
    assert store.last_done("node2", "drain") == 12.0
    assert store.last_done("node2", "resume") is None
    assert [a.id for a in store.node_actions("node2")] == [aid]
    assert [a.id for a in store.done_since(12.0)] == [aid]


def test_actions_since_counts_requeues(store: Store) -> None:
    for t in (10.0, 50.0, 70.0):
        store.add_action("requeue", None, 7, "", "c", t)
    assert store.actions_since("requeue", 40.0) == 2
    assert [a.job_id for a in store.job_actions(7)] == [7, 7, 7]


def test_jobs_round_trip(store: Store) -> None:
    job = TrackedJob(7, 3, 1, "NODE_FAIL", "requeued", 5.0, 0, 120, 6.0)
    store.upsert_job(job)
    assert store.job(7) == job and store.jobs() == {7: job}
    assert store.job(8) is None


def test_events_paging(store: Store) -> None:
    ids = [store.add_event("fault", f"m{i}", float(i), node=f"node{i % 2}") for i in range(10)]
    assert [e.id for e in store.events(limit=3)] == ids[-3:]
    assert [e.id for e in store.events(since_id=ids[2], limit=3)] == ids[3:6]
    assert {e.node for e in store.events(node="node1")} == {"node1"}


def test_committed_intent_survives_kill_9(store_target: StoreTarget, open_store: OpenStore) -> None:
    code = OPEN_IN_CHILD + (
        "import os\n"
        "s.add_action('drain', 'node2', None, 'hyperpod:reset gpu0 x', 'c', 1.0)\n"
        "os._exit(137)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *target_argv(store_target)], timeout=60, check=False
    )
    assert proc.returncode == 137
    [row] = open_store(store_target).open_actions()
    assert (row.kind, row.node, row.state) == ("drain", "node2", "intent")


def test_failed_transaction_leaves_nothing(store: Store) -> None:
    with pytest.raises(INTEGRITY_ERRORS):
        store.upsert_job(TrackedJob(7, None, 0))  # type: ignore[arg-type]
    assert store.jobs() == {}


def test_prune_forgets_old_history_but_never_open_state(store: Store) -> None:
    store.record_report("node1", "a", 1, 10.0, "faulty", "{}", [F0], 10.0)
    store.record_report("node1", "a", 2, 20.0, "healthy", "{}", [], 20.0)  # closes F0
    store.record_report("node2", "a", 1, 20.0, "faulty", "{}", [F1], 20.0)  # stays open
    old_done = store.add_action("drain", "node1", None, "r", "c", 10.0)
    store.update_action(old_done, "done", 10.0)
    open_intent = store.add_action("drain", "node3", None, "r", "c", 10.0)
    store.add_event("fault", "old", 10.0)
    store.add_event("fault", "new", 500.0)
    store.upsert_job(TrackedJob(7, 3, 0, "", "done", updated_at=10.0))
    store.upsert_job(TrackedJob(8, 3, 0, "", "tracked", updated_at=10.0))
    assert store.prune(100.0) == 4
    assert [e.message for e in store.events()] == ["new"]
    assert [f.node for f in store.faults_since(0)] == ["node2"]
    assert [a.id for a in store.open_actions()] == [open_intent]
    assert store.action(old_done) is None
    assert set(store.jobs()) == {8}


# --- deep-check runs ------------------------------------------------------------------------


def test_deep_check_runs_and_outcomes(store: Store) -> None:
    from hyperpod_agent.controller.store.checks import NodeOutcome
    from hyperpod_agent.controller.store.rows import EventIn

    ev = EventIn("deep_check_planned", "planned")
    first = store.add_check_run(
        ["node1", "node2"], "quick", "admin", {"node1": ""}, "u", False, 100.0, ev
    )
    second = store.add_check_run(["node1"], "full", "spare", {}, "u", True, 200.0, ev)
    assert [r.id for r in store.open_check_runs()] == [first, second]
    assert store.check_run(second).phase == "draining"  # type: ignore[union-attr]
    store.set_check_phase(
        first,
        "restore",
        150.0,
        job_id=7,
        outcomes=[
            NodeOutcome(first, "node1", "admin", "OK", "", "fine", True, 150.0),
            NodeOutcome(first, "node2", "admin", "FAIL", "nccl", "slow", True, 150.0, [{"a": 1}]),
        ],
    )
    store.set_check_phase(
        second,
        "restore",
        250.0,
        outcomes=[NodeOutcome(second, "node1", "spare", "FAIL", "dcgm", "ecc", True, 250.0)],
    )
    latest = store.latest_outcomes()
    assert (latest["node1"].run_id, latest["node1"].outcome) == (second, "FAIL")
    assert latest["node2"].detail == [{"a": 1}]
    store.set_check_phase(first, "done", 300.0, touch_outcomes=True)
    assert store.latest_outcomes()["node1"].run_id == first  # dated when its nodes were back
    assert [r.id for r in store.open_check_runs()] == [second]
    assert [o.run_id for o in store.node_outcomes("node1")] == [first, second]
    with pytest.raises(ValueError, match="unknown phase"):
        store.set_check_phase(first, "sideways", 300.0)
    assert store.prune(1000.0) > 0 and store.check_run(first) is None
    assert store.check_run(second) is not None  # open runs are never pruned
