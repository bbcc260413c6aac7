"""Leases with fencing tokens: which controller may write intents (DESIGN §14).

A lease has one holder until it expires; every new holder gets a larger token. An
intent write that names the lease it is made under (``fence``) checks, in the same
transaction, that the lease is still the writer's and unexpired, so a controller that
lost its lease (paused, partitioned, slow) cannot write an intent after another took
over. The check is a no-op UPDATE of the lease row: on PostgreSQL it locks the row
until the intent commits, so a takeover waits for it and the order is total.

Expiry is judged with the caller's clock (``now``, as every store call): controllers
sharing a database need synchronised clocks and a ``ttl`` well above their skew.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hyperpod_agent.controller.store.database import Database
from hyperpod_agent.controller.store.dialect import Tx
from hyperpod_agent.errors import HyperpodError

LEADER = "leader"


class LeaseLost(HyperpodError):
    """A write fenced by a lease its writer no longer holds; nothing was written."""


@dataclass(frozen=True)
class Lease:
    name: str
    holder: str  # '' when released
    token: int
    expires_at: float
    # When ``holder`` took it (a new token); not part of what a fence compares.
    since: float = field(default=0.0, compare=False)


class LeaseLog(Database):
    """Acquire, renew and release leases; fence writes with them."""

    # The clock a fence is checked with; the controller sets its own, so a write late
    # in a long pass is judged at its own time, not the pass's start (``now``).
    fence_clock: Callable[[], float] | None = None

    def lease(self, name: str = LEADER) -> Lease | None:
        rows = self._query(
            "SELECT name, holder, token, expires_at, since FROM leases WHERE name=?", (name,)
        )
        if not rows:
            return None
        row = rows[0]
        return Lease(row[0], row[1], int(row[2]), float(row[3]), float(row[4]))

    def acquire(self, holder: str, ttl: float, now: float, name: str = LEADER) -> Lease | None:
        """The lease for ``holder`` until ``now + ttl`` when it is free, expired or
        already ``holder``'s (keeping its token then); None while another holds it."""
        if not holder:
            raise ValueError("a lease holder needs a name")
        with self._tx(durable=True) as db:
            db.execute(
                "INSERT INTO leases (name, holder, token, expires_at) VALUES (?, '', 0, 0) "
                "ON CONFLICT(name) DO NOTHING",
                (name,),
            )
            # One conditional UPDATE: concurrent contenders serialise on the row and
            # the later one re-reads it, so exactly one wins.
            row = db.execute(
                "UPDATE leases SET token = CASE WHEN holder=? AND expires_at>? THEN token "
                "ELSE token + 1 END, since = CASE WHEN holder=? AND expires_at>? THEN since "
                "ELSE ? END, holder=?, expires_at=? "
                "WHERE name=? AND (holder=? OR holder='' OR expires_at<=?) "
                "RETURNING token, since",
                (holder, now, holder, now, now, holder, now + ttl, name, holder, now),
            ).fetchone()
        if row is None:
            return None
        return Lease(name, holder, int(row[0]), now + ttl, float(row[1]))

    def renew(self, lease: Lease, ttl: float, now: float) -> Lease | None:
        """``lease`` extended to ``now + ttl``; None when it was lost or expired (the
        holder must stop writing and acquire again)."""
        with self._tx(durable=True) as db:
            row = db.execute(
                "UPDATE leases SET expires_at=? WHERE name=? AND holder=? AND token=? "
                "AND expires_at>? RETURNING token",
                (now + ttl, lease.name, lease.holder, lease.token, now),
            ).fetchone()
        if row is None:
            return None
        return Lease(lease.name, lease.holder, lease.token, now + ttl, lease.since)

    def release(self, lease: Lease) -> bool:
        """Give ``lease`` up at once (a clean shutdown); False when it was not held."""
        with self._tx(durable=True) as db:
            row = db.execute(
                "UPDATE leases SET holder='', expires_at=0 WHERE name=? AND holder=? AND "
                "token=? RETURNING token",
                (lease.name, lease.holder, lease.token),
            ).fetchone()
        return row is not None

    def _check_fence(self, db: Tx, fence: Lease, now: float) -> None:
        """Inside the writing transaction: LeaseLost unless ``fence`` still holds."""
        if self.fence_clock is not None:
            now = max(now, self.fence_clock())
        held = db.execute(
            "UPDATE leases SET token=token WHERE name=? AND holder=? AND token=? "
            "AND expires_at>? RETURNING token",
            (fence.name, fence.holder, fence.token, now),
        ).fetchone()
        if held is not None:
            return
        row = db.execute("SELECT holder, token FROM leases WHERE name=?", (fence.name,)).fetchone()
        if row is not None and (row[0], int(row[1])) == (fence.holder, fence.token):
            why = "expired"
        else:
            why = f"is held by {row[0] or 'nobody'} (token {row[1]})" if row else "does not exist"
        raise LeaseLost(f"lease {fence.name!r} {why}, not by {fence.holder} (token {fence.token})")
