"""The bounded replay cache never lets a dropped entry be replayed."""

from __future__ import annotations

from hyperpod_agent.auth import ReplayCache


def test_fresh_then_replayed() -> None:
    cache = ReplayCache(size=16, window_s=120)
    assert cache.check_and_add("a", 100.0, 100.0) is None
    assert cache.check_and_add("a", 100.0, 101.0) == "replayed credential"
    assert cache.check_and_add("b", 100.0, 101.0) is None


def test_entries_expire_after_the_window() -> None:
    cache = ReplayCache(size=16, window_s=10)
    cache.check_and_add("a", 100.0, 100.0)
    # Past the window the timestamp check refuses it anyway; the cache may forget it.
    assert cache.check_and_add("b", 200.0, 200.0) is None
    assert "a" not in cache._seen


def test_full_cache_raises_the_floor() -> None:
    cache = ReplayCache(size=16, window_s=1000)
    for i in range(16):
        assert cache.check_and_add(f"k{i}", 100.0 + i, 120.0) is None
    assert cache.check_and_add("k16", 116.0, 120.0) is None  # drops k0 (stamped 100)
    assert cache.floor == 100.0
    assert len(cache._seen) == 16
    # k0 was forgotten, but its stamp is at the floor, so it cannot come back.
    assert cache.check_and_add("k0", 100.0, 121.0) == (
        "credential older than the replay cache can vouch for"
    )
    assert cache.check_and_add("late", 100.5, 121.0) is None
