"""The bounded replay cache: no dropped entry can be replayed, and no identity can
push others out or lock them out, whatever it stamps on its credentials."""

from __future__ import annotations

from hyperpod_agent.auth.tokens import Refusal, ReplayCache

NOW = 1_000.0
REPLAYED = Refusal(401, "replayed credential")
TOO_OLD = Refusal(401, "credential older than the replay cache can vouch for")


def test_fresh_then_replayed() -> None:
    cache = ReplayCache(size=16, window_s=120)
    assert cache.check_and_add("a", "node1", 100.0, 100.0) is None
    assert cache.check_and_add("a", "node1", 100.0, 101.0) == REPLAYED
    assert cache.check_and_add("b", "node1", 100.0, 101.0) is None


def test_entries_expire_by_receive_time_not_by_stamp() -> None:
    cache = ReplayCache(size=16, window_s=10)
    # Stamped far ahead: still forgotten once the window has passed since it arrived.
    cache.check_and_add("a", "node1", NOW + 1_000, NOW)
    assert cache.seen("a")
    assert cache.check_and_add("b", "node1", NOW + 11, NOW + 11) is None
    assert not cache.seen("a")
    # Stamped in the past: kept for the whole window after arrival.
    cache.check_and_add("c", "node1", NOW - 1_000, NOW + 12)
    assert cache.check_and_add("c", "node1", NOW - 1_000, NOW + 21) == REPLAYED


def test_one_identity_over_its_share_gets_429_and_evicts_nobody() -> None:
    cache = ReplayCache(size=64, window_s=120, per_identity=8)
    assert cache.check_and_add("honest", "node2", NOW, NOW) is None
    # A flood stamped at the edge of the allowed skew, into the future.
    for i in range(8):
        assert cache.check_and_add(f"f{i}", "node1", NOW + 60, NOW) is None
    refused = cache.check_and_add("f8", "node1", NOW + 60, NOW)
    assert refused is not None and refused.status == 429
    assert "node1" not in refused.message  # the caller knows who it is; no echo needed
    # The others are untouched: their entries stay, their honest requests pass.
    assert cache.check_and_add("honest", "node2", NOW, NOW + 1) == REPLAYED
    assert cache.check_and_add("honest-2", "node2", NOW + 1, NOW + 1) is None
    # Once its own entries expire, the flooder may speak again.
    assert cache.check_and_add("f9", "node1", NOW + 121, NOW + 121) is None


def test_a_full_cache_evicts_from_the_largest_identity_and_raises_only_its_floor() -> None:
    cache = ReplayCache(size=16, window_s=120, per_identity=12)
    for i in range(4):
        assert cache.check_and_add(f"h{i}", "node2", NOW, NOW) is None
    for i in range(12):
        assert cache.check_and_add(f"f{i}", "node1", NOW + 60 + i, NOW) is None
    # Full (16): a new identity's request drops node1's oldest entry, not node2's.
    assert cache.check_and_add("x", "node3", NOW, NOW) is None
    assert cache.seen("h0") and not cache.seen("f0")
    # f0 was forgotten, but it can never come back: node1's floor is its stamp.
    assert cache.check_and_add("f0", "node1", NOW + 60, NOW + 1) == TOO_OLD
    # node1 locked itself out of stamps at or below its floor, nobody else did.
    assert cache.check_and_add("h9", "node2", NOW + 1, NOW + 1) is None
    assert cache.check_and_add("y", "node3", NOW + 1, NOW + 1) is None


def test_floors_are_forgotten_once_the_window_has_passed() -> None:
    cache = ReplayCache(size=16, window_s=120, per_identity=16)
    for i in range(16):
        cache.check_and_add(f"f{i}", "node1", NOW + 60, NOW)
    cache.check_and_add("other", "node2", NOW, NOW)
    assert cache.floor("node1") == NOW + 60
    cache.check_and_add("later", "node2", NOW + 500, NOW + 500)
    assert cache.floor("node1") is None
