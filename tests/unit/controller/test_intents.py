"""Open intents are applied only to the node they were planned against, only while
young, and their outcome (state, accounting, event) is recorded in one transaction."""

from __future__ import annotations

import pytest
from ctl_helpers import NOW, FakeSlurm, cluster, config, job, node
from store_helpers import INTEGRITY_ERRORS

from hyperpod_agent.controller.actions import Executor
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
from hyperpod_agent.controller.snapshot import Decision, Kind, PlannedAction
from hyperpod_agent.controller.store.facade import Store

OURS = "hyperpod:reset gpu0 xid46 boom"


class Crash(BaseException):  # a real crash is os._exit: nothing catches it
    """The process dying at a given point of an action."""


def crash_at(where: str):  # type: ignore[no-untyped-def]
    def hook(point: str) -> None:
        if point == where or point.startswith(where + ":"):
            raise Crash(point)

    return hook


def executor(store: Store, slurm: FakeSlurm, **policy: object) -> Executor:
    return Executor(store, slurm, SparePoolProvider(slurm), config(policy=policy))


def kinds(store: Store) -> list[str]:
    return [e.kind for e in store.events()]


def test_a_retried_resume_leaves_a_node_an_admin_drained_meanwhile(store: Store) -> None:
    nodes = cluster(4)
    nodes["node2"] = node("node2", flags=("DRAIN",), reason=OURS)
    slurm = FakeSlurm(nodes)
    slurm.fail_next["resume"] = 1
    ex = executor(store, slurm)
    ex.execute(Decision([PlannedAction(Kind.RESUME, "node2", "", "healthy")]), nodes, [], NOW)
    assert [r.kind for r in store.open_actions()] == ["resume"]  # will be retried
    slurm.drain("node2", "maintenance")  # an admin takes the node
    slurm.calls.clear()
    ex.process_open(slurm.nodes, [], NOW + 60)
    assert slurm.calls == [] and slurm.nodes["node2"].reason == "maintenance"
    assert store.open_actions() == [] and kinds(store)[-1] == "abandoned"
    assert "from 'hyperpod:reset gpu0 xid46 boom' to 'maintenance'" in store.events()[-1].message


def test_a_retried_drain_never_rewrites_an_admins_reason(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    slurm.fail_next["drain"] = 1
    ex = executor(store, slurm)
    plan = PlannedAction(Kind.DRAIN, "node2", OURS, "gpu0 xid46")
    ex.execute(Decision([plan]), dict(slurm.nodes), [], NOW)
    slurm.drain("node2", "maintenance")
    slurm.calls.clear()
    ex.process_open(slurm.nodes, [], NOW + 60)
    assert slurm.calls == [] and slurm.nodes["node2"].reason == "maintenance"
    assert store.action(1) is not None and store.action(1).state == "abandoned"  # type: ignore[union-attr]


def test_a_change_between_plan_and_apply_is_seen(store: Store) -> None:
    # The pass read node2 in service; an admin drained it before the intent applied.
    slurm = FakeSlurm(cluster(4))
    planned_view = dict(slurm.nodes)
    slurm.drain("node2", "maintenance")
    slurm.calls.clear()
    plan = PlannedAction(Kind.REBOOT, "node2", "hyperpod:reboot gpu0 xid79 x", "c")
    executor(store, slurm).execute(Decision([plan]), planned_view, [], NOW)
    assert slurm.calls == [] and kinds(store) == ["abandoned"]


def test_an_intent_already_carrying_our_reason_is_finished(store: Store) -> None:
    # A replacement drained the node before the controller stopped: the replay goes on.
    nodes = cluster(4)
    nodes["node5"] = node("node5", flags=("DRAIN",), reason="hyperpod:spare")
    slurm = FakeSlurm(nodes)
    slurm.fail_next["resume"] = 1
    ex = executor(store, slurm)
    plan = PlannedAction(
        Kind.REPLACE, "node3", "hyperpod:replace gpu0 xid54 x", "c", params={"spare": "node5"}
    )
    ex.execute(Decision([plan]), dict(slurm.nodes), [], NOW)
    assert slurm.nodes["node3"].reason == plan.reason  # drained, the spare not yet resumed
    ex.process_open(slurm.nodes, [], NOW + 60)
    assert slurm.names("resume") == ["node5", "node5"] and not slurm.nodes["node5"].drained


def test_intents_expire(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    slurm.fail_next["drain"] = 1
    ex = executor(store, slurm, intent_max_age_s=300)
    ex.execute(Decision([PlannedAction(Kind.DRAIN, "node2", OURS, "c")]), slurm.nodes, [], NOW)
    slurm.calls.clear()
    ex.process_open(slurm.nodes, [], NOW + 301)
    assert slurm.calls == [] and store.open_actions() == []
    assert "not applied within 300 s of being planned" in store.events()[-1].message


def test_a_node_gone_from_slurm_abandons_its_intent(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    slurm.fail_next["drain"] = 1
    ex = executor(store, slurm)
    ex.execute(Decision([PlannedAction(Kind.DRAIN, "node2", OURS, "c")]), slurm.nodes, [], NOW)
    del slurm.nodes["node2"]
    ex.process_open(slurm.nodes, [], NOW + 60)
    assert "no longer in Slurm" in store.events()[-1].message


def test_an_old_intent_without_a_seen_reason_respects_the_owner(store: Store) -> None:
    slurm = FakeSlurm(cluster(4))
    store.add_action("resume", "node2", None, "", "healthy", NOW)  # as older versions wrote
    slurm.drain("node2", "maintenance")
    slurm.calls.clear()
    executor(store, slurm).process_open(slurm.nodes, [], NOW + 1)
    assert slurm.calls == [] and kinds(store) == ["abandoned"]


def test_a_crash_between_requeue_and_its_record_counts_once(store: Store) -> None:
    slurm = FakeSlurm(cluster(4), [job(7, state="NODE_FAIL")])
    plan = PlannedAction(
        Kind.REQUEUE,
        None,
        "",
        "job ended NODE_FAIL",
        job_id=7,
        params={"restart_count": 0, "cap": 3, "attempt": 1},
    )
    ex = Executor(store, slurm, SparePoolProvider(slurm), config(), crash_hook=crash_at("applied"))
    with pytest.raises(Crash):
        ex.execute(Decision([plan]), slurm.nodes, slurm.list_jobs(), NOW)
    assert slurm.names("requeue") == [7]
    assert store.job(7) is None and kinds(store) == []  # nothing recorded yet
    restarted = executor(store, slurm)
    for t in (1, 2, 3):
        restarted.process_open(slurm.nodes, slurm.list_jobs(), NOW + t)
    tracked = store.job(7)
    assert tracked is not None and tracked.attempts == 1 and tracked.state == "requeued"
    assert kinds(store) == ["requeue"] and slurm.names("requeue") == [7]


def test_a_failed_commit_rolls_back_and_the_store_goes_on(store: Store) -> None:
    # A deferred foreign key is checked at COMMIT: a real failing commit.
    with store._tx() as db:  # noqa: SLF001 - the test sets up a table only it uses
        db.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        db.execute(
            "CREATE TABLE child (pid INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)"
        )
    with pytest.raises(INTEGRITY_ERRORS), store._tx() as db:  # noqa: SLF001
        db.execute("INSERT INTO child VALUES (42)")
    if store.dialect.name == "sqlite":
        assert not store._backend.in_transaction  # type: ignore[attr-defined]  # noqa: SLF001
    aid = store.add_action("drain", "node1", None, OURS, "c", NOW)
    assert store.action(aid) is not None
