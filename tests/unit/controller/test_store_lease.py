"""The leader lease: one holder at a time, a fencing token that grows with every new
holder, and intents written only under the lease (on both backends)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from store_helpers import StoreTarget

from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.lease import Lease, LeaseLost
from hyperpod_agent.controller.store.url import PostgresLocation

OpenStore = Callable[[StoreTarget], Store]
TTL = 30.0


def test_one_holder_until_it_expires_then_a_new_token(store: Store) -> None:
    a = store.acquire("ctl-a", TTL, 100.0)
    assert a == Lease("leader", "ctl-a", 1, 130.0)
    assert store.acquire("ctl-b", TTL, 129.0) is None
    assert store.lease() == a
    b = store.acquire("ctl-b", TTL, 130.0)  # expired at 130: free
    assert b == Lease("leader", "ctl-b", 2, 160.0)
    assert store.renew(a, TTL, 131.0) is None  # a lost it
    assert not store.release(a)
    assert store.lease() == b


def test_the_holder_renews_and_reacquires_keeping_its_token(store: Store) -> None:
    a = store.acquire("ctl-a", TTL, 100.0)
    assert a is not None
    renewed = store.renew(a, TTL, 120.0)
    assert renewed == Lease("leader", "ctl-a", 1, 150.0)
    assert store.acquire("ctl-a", TTL, 140.0) == Lease("leader", "ctl-a", 1, 170.0)
    assert store.renew(a, TTL, 170.0) is None  # too late: expired


def test_release_frees_it_and_the_next_holder_gets_a_higher_token(store: Store) -> None:
    a = store.acquire("ctl-a", TTL, 100.0)
    assert a is not None and store.release(a)
    assert store.lease() == Lease("leader", "", 1, 0.0)
    b = store.acquire("ctl-b", TTL, 101.0)
    assert b is not None and b.token == 2
    again = store.acquire("ctl-a", TTL, 200.0)  # b expired: a is back, with a new token
    assert again is not None and again.token == 3


def test_leases_are_independent_by_name(store: Store) -> None:
    assert store.acquire("ctl-a", TTL, 100.0, name="x") is not None
    assert store.acquire("ctl-b", TTL, 100.0, name="y") is not None
    assert store.acquire("ctl-b", TTL, 100.0, name="x") is None


def test_an_intent_needs_the_lease_it_is_fenced_by(store: Store) -> None:
    a = store.acquire("ctl-a", TTL, 100.0)
    assert a is not None
    aid = store.add_action("drain", "node1", None, "r", "c", 101.0, fence=a)
    store.update_action(aid, "applied", 102.0, fence=a)
    b = store.acquire("ctl-b", TTL, 200.0)
    assert b is not None
    with pytest.raises(LeaseLost, match="lease 'leader' is held by ctl-b"):
        store.add_action("drain", "node2", None, "r", "c", 201.0, fence=a)
    with pytest.raises(LeaseLost):
        store.update_action(aid, "done", 201.0, fence=a)
    [row] = store.open_actions()  # neither write happened
    assert (row.id, row.state) == (aid, "applied")
    store.update_action(aid, "done", 202.0, fence=b)
    assert store.open_actions() == []


def test_an_expired_lease_fences_even_before_anyone_takes_it(store: Store) -> None:
    a = store.acquire("ctl-a", TTL, 100.0)
    assert a is not None
    with pytest.raises(LeaseLost, match="expired"):
        store.add_action("drain", "node1", None, "r", "c", 130.0, fence=a)
    assert store.open_actions() == []


def race(contenders: list[Store], name: str) -> dict[str, Lease | None]:
    """Every contender tries to acquire ``name`` at once; what each got."""
    barrier = threading.Barrier(len(contenders), timeout=30)
    got: dict[str, Lease | None] = {}
    errors: list[BaseException] = []

    def contend(store: Store, holder: str) -> None:
        try:
            barrier.wait()
            got[holder] = store.acquire(holder, TTL, 100.0, name=name)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=contend, args=(s, f"ctl-{i}")) for i, s in enumerate(contenders)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and not any(t.is_alive() for t in threads)
    return got


def test_two_contenders_racing_get_exactly_one_holder_each_time(
    store_target: StoreTarget, open_store: OpenStore
) -> None:
    contenders = [open_store(store_target), open_store(store_target)]  # own connections
    for round_ in range(20):
        name = f"race{round_}"
        # The usual race: the leader's lease expired and the standbys see it at once.
        assert contenders[0].acquire("ctl-old", 1.0, 0.0, name=name) is not None
        got = race(contenders, name)
        winners = [lease for lease in got.values() if lease is not None]
        assert len(got) == 2 and len(winners) == 1, got
        assert contenders[0].lease(name) == winners[0] and winners[0].token == 2


@pytest.mark.pg
def test_a_takeover_waits_for_an_intent_being_written_under_the_old_lease(
    pg_location: PostgresLocation, open_store: OpenStore
) -> None:
    old, new = open_store(pg_location), open_store(pg_location)
    lease = old.acquire("ctl-a", TTL, 100.0)
    assert lease is not None
    took: list[Lease | None] = []
    with old._tx(durable=True) as db:
        old._check_fence(db, lease, 129.0)  # checked just before expiry ...
        taker = threading.Thread(target=lambda: took.append(new.acquire("ctl-b", TTL, 131.0)))
        taker.start()
        # ... and the takeover, after expiry, blocks on the lease row until this commits.
        for _ in range(600):
            waiting = old._query(
                "SELECT count(*) FROM pg_stat_activity WHERE datname=? AND wait_event_type='Lock'",
                (pg_location.dbname,),
            )
            if waiting[0][0] == 1:
                break
            taker.join(timeout=0.05)
        assert waiting[0][0] == 1 and took == []
        db.execute(
            "INSERT INTO actions (kind, reason, cause, params, state, created_at, updated_at, "
            "next_attempt_at) VALUES ('drain', 'r', 'c', '{}', 'intent', 129, 129, 129)"
        )
    taker.join(timeout=60)
    assert took == [Lease("leader", "ctl-b", 2, 161.0)]
    assert [a.created_at for a in new.open_actions()] == [129.0]
    with pytest.raises(LeaseLost):
        old.add_action("drain", "node2", None, "r", "c", 132.0, fence=lease)


def test_since_is_when_the_holder_took_the_lease(store: Store) -> None:
    a = store.acquire("ctl-a", TTL, 100.0)
    assert a is not None and a.since == 100.0
    renewed = store.renew(a, TTL, 110.0)
    assert renewed is not None and renewed.since == 100.0
    again = store.acquire("ctl-a", TTL, 120.0)
    assert again is not None and again.since == 100.0
    held = store.lease()
    assert held is not None and held.since == 100.0
    b = store.acquire("ctl-b", TTL, 200.0)  # a's expired: b takes it now
    assert b is not None and b.since == 200.0
    held = store.lease()
    assert held is not None and held.since == 200.0
