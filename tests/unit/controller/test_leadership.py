"""Leadership on a real PostgreSQL database: exactly one controller leads, a leader
stops leading before another can take over, and a clean stop hands over at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from ha_helpers import RENEW, TTL, Clock

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.leadership import Leadership
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.url import PostgresLocation

pytestmark = pytest.mark.pg
ROUNDS = 20
WAIT_S = 10.0


@pytest.fixture
def stores(pg_location: PostgresLocation) -> Iterator[list[Store]]:
    opened = [Store(pg_location), Store(pg_location)]
    yield opened
    for s in opened:
        s.close()


def pair(stores: list[Store], clock: Clock) -> tuple[Leadership, Leadership]:
    return (
        Leadership(stores[0], "ctl-a:8787", TTL, RENEW, clock=clock),
        Leadership(stores[1], "ctl-b:8787", TTL, RENEW, clock=clock),
    )


def test_one_leads_the_other_stands_by(stores: list[Store]) -> None:
    clock = Clock()
    a, b = pair(stores, clock)
    assert a.tick() and not b.tick()
    assert a.is_leader() and not b.is_leader()
    lease = a.lease()
    assert lease is not None and lease.holder == "ctl-a:8787"
    assert b.lease() is None
    assert a.since == clock.t
    assert b.leader() == ("ctl-a:8787", clock.t)
    assert a.leader() == ("ctl-a:8787", clock.t)


def test_renewing_keeps_the_lease_and_its_token(stores: list[Store]) -> None:
    clock = Clock()
    a, b = pair(stores, clock)
    assert a.tick()
    first = a.lease()
    for _ in range(10):
        clock.t += RENEW
        assert a.tick() and not b.tick()
    renewed = a.lease()
    assert first is not None and renewed is not None and renewed.token == first.token
    assert a.since == clock.t - 10 * RENEW  # leading since it first took the lease


def test_a_leader_stops_leading_before_its_lease_expires_by_its_own_clock(
    stores: list[Store],
) -> None:
    clock = Clock()
    a, b = pair(stores, clock)
    assert a.tick()
    lease = a.lease()
    assert lease is not None
    clock.t = lease.expires_at - RENEW - 0.001
    assert a.is_leader()
    clock.t = lease.expires_at - RENEW  # no renew happened: it stops acting now,
    assert not a.is_leader() and a.lease() is None
    assert not b.tick()  # while the lease is still its own in the store
    clock.t = lease.expires_at
    assert b.tick() and b.is_leader()
    assert not a.tick()  # a's renew finds the lease gone
    taken = b.lease()
    assert taken is not None and taken.token == lease.token + 1


def test_a_leader_whose_renew_fails_stops_leading_at_once(
    stores: list[Store], pg_location: PostgresLocation
) -> None:
    clock = Clock()
    broken = Store(pg_location)
    a = Leadership(broken, "ctl-a:8787", TTL, RENEW, clock=clock)
    assert a.tick()
    broken.close()  # the database is unreachable from a
    clock.t += RENEW
    assert not a.tick()
    assert not a.is_leader() and a.lease() is None and a.since is None


def test_release_on_a_clean_stop_hands_over_at_once(stores: list[Store]) -> None:
    clock = Clock()
    a, b = pair(stores, clock)
    assert a.tick() and not b.tick()
    a.stop(release=True)
    assert not a.is_leader()
    assert b.tick()  # same instant: no wait for the TTL


def test_the_background_thread_takes_the_lease_and_wakes_the_caller(
    stores: list[Store],
) -> None:
    gained = threading.Event()
    a = Leadership(stores[0], "ctl-a:8787", TTL, 0.05, on_change=gained.set)
    a.start()
    try:
        assert gained.wait(WAIT_S)
        assert a.is_leader()
    finally:
        a.stop(release=True)
    assert not a.is_leader()
    b = Leadership(stores[1], "ctl-b:8787", TTL, RENEW)
    assert b.tick()


def contend(who: Leadership, barrier: threading.Barrier, won: dict[str, bool]) -> None:
    barrier.wait()
    won[who.controller_id] = who.tick()


def test_two_started_at_once_exactly_one_leads_every_time(stores: list[Store]) -> None:
    for round_ in range(ROUNDS):
        clock = Clock()
        a, b = pair(stores, clock)
        barrier = threading.Barrier(2, timeout=WAIT_S)
        won: dict[str, bool] = {}

        threads = [threading.Thread(target=contend, args=(x, barrier, won)) for x in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert sorted(won.values()) == [False, True], f"round {round_}: {won}"
        assert a.is_leader() != b.is_leader()
        leader = a if a.is_leader() else b
        assert leader.leader() == (leader.controller_id, clock.t)
        leader.stop(release=True)


def test_each_takeover_is_an_event_naming_the_new_leader(stores: list[Store]) -> None:
    clock = Clock()
    a, b = pair(stores, clock)
    assert a.tick()
    lease = a.lease()
    assert lease is not None
    for _ in range(3):  # renewals are no takeover
        clock.t += RENEW
        assert a.tick()
    clock.t = lease.expires_at + 3 * RENEW + 1
    assert b.tick()
    leads = [e for e in stores[0].events(limit=50) if e.kind == "leader"]
    assert [e.message for e in sorted(leads, key=lambda e: e.id)] == [
        f"ctl-a:8787 leads (lease token {lease.token})",
        f"ctl-b:8787 leads (lease token {lease.token + 1})",
    ]


def test_the_leader_gauge_follows_the_clock_without_a_renew(stores: list[Store]) -> None:
    # A renew stuck on an unreachable database must not leave the gauge saying "leader".
    clock = Clock()
    a, _ = pair(stores, clock)
    a.start_gauge()
    assert a.tick()
    assert metrics.REGISTRY.get_sample_value("hyperpod_controller_leader") == 1.0
    lease = a.lease()
    assert lease is not None
    clock.t = lease.expires_at - RENEW
    assert metrics.REGISTRY.get_sample_value("hyperpod_controller_leader") == 0.0
