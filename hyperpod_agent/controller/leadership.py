"""Leader and standby: which of several controllers sharing one PostgreSQL store acts
(DESIGN §14, docs/controller.md "High availability").

A background thread takes or renews the ``leader`` lease every ``renew_every_s`` on
its own schedule, so a long reconcile pass never lets it lapse. Leading is judged with
this controller's own clock and a margin: a leader stops acting ``renew_every_s``
before its lease ends, so it has stopped before another can take the lease (with
clocks synchronised well within that margin). A renew that fails (the database
unreachable, the lease taken) ends leading at once. Intent writes are fenced with the
lease as well (store/lease.py): a leader that did not notice in time still cannot
write one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.ingest import Rejected
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.lease import Lease

log = logging.getLogger(__name__)


class NotLeader(Rejected):
    """An admin write sent to a standby: the client tries the next controller."""

    def __init__(self, me: str, leader: str | None) -> None:
        who = leader or "none elected yet"
        super().__init__(503, "not_leader", f"{me} is a standby; send this to the leader ({who})")
        self.leader = leader


class Leadership:
    """This controller's claim on the ``leader`` lease. Thread-safe."""

    def __init__(
        self,
        store: Store,
        controller_id: str,
        ttl_s: float,
        renew_every_s: float,
        *,
        clock: Callable[[], float] = time.time,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.controller_id = controller_id
        self.ttl_s = ttl_s
        self.renew_every_s = renew_every_s
        self.clock = clock
        # Called when this controller starts or stops leading (wakes the loop).
        self.on_change = on_change
        self._lease: Lease | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def lease(self) -> Lease | None:
        """The lease to fence writes with while this controller leads, else None."""
        with self._lock:
            lease = self._lease
        if lease is None or self.clock() >= lease.expires_at - self.renew_every_s:
            return None
        return lease

    def is_leader(self) -> bool:
        return self.lease() is not None

    @property
    def since(self) -> float | None:
        """When this controller took the lease; None while it does not lead."""
        lease = self.lease()
        return lease.since if lease is not None else None

    def leader(self) -> tuple[str, float] | None:
        """Who leads by the store, and since when; None when nobody holds the lease."""
        lease = self.store.lease()
        if lease is None or not lease.holder or lease.expires_at <= self.clock():
            return None
        return lease.holder, lease.since

    def not_leader(self) -> NotLeader:
        """The refusal of a write this standby must not make."""
        try:
            current = self.leader()
        except Exception:  # noqa: BLE001 - the refusal stands without the name
            current = None
        return NotLeader(self.controller_id, current[0] if current else None)

    def tick(self) -> bool:
        """Renew the lease, or take it when free; returns whether this one leads."""
        now = self.clock()
        with self._lock:
            held = self._lease
        try:
            got = self.store.renew(held, self.ttl_s, now) if held is not None else None
            if got is None:
                got = self.store.acquire(self.controller_id, self.ttl_s, now)
        except Exception as exc:  # noqa: BLE001 - the database is gone: stop leading
            self._set(None, f"cannot renew the lease: {exc}")
            return False
        self._set(got, "the lease is held by another controller")
        return self.is_leader()

    def drop(self, why: str) -> None:
        """Stop leading now (a fenced write found the lease lost)."""
        self._set(None, why)

    def _set(self, lease: Lease | None, why: str) -> None:
        with self._lock:
            was = self._lease is not None
            self._lease = lease
        if lease is not None and not was:
            log.warning("%s leads now (lease token %d)", self.controller_id, lease.token)
            self._record(lease)
        elif lease is None and was:
            log.warning("%s no longer leads: %s", self.controller_id, why)
        else:
            return
        if self.on_change is not None:
            self.on_change()

    def _record(self, lease: Lease) -> None:
        """An event per takeover, so the event log tells which controller acted when."""
        try:
            self.store.add_event(
                "leader",
                f"{self.controller_id} leads (lease token {lease.token})",
                self.clock(),
                cause=f"lease since {lease.since:.3f}",
            )
        except Exception as exc:  # noqa: BLE001 - leading does not depend on the record
            log.warning("could not record the takeover: %s", exc)

    # -- the renewing thread --------------------------------------------------------
    def start_gauge(self) -> None:
        """``hyperpod_controller_leader`` reads :meth:`is_leader` when scraped: a renew
        stuck on an unreachable database cannot leave it saying "leader"."""
        metrics.LEADER.set_function(lambda: 1.0 if self.is_leader() else 0.0)

    def start(self) -> None:
        """Take or renew the lease every ``renew_every_s`` until ``stop``."""
        self.start_gauge()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="leadership", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.tick()
            next_at += self.renew_every_s
            # On schedule whatever a tick took; never a burst after a long stall.
            next_at = max(next_at, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def stop(self, release: bool = True) -> None:
        """Stop renewing; with ``release`` give the lease up so a standby takes over at
        once (a clean shutdown, after the loop stopped acting)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(10.0, 2 * self.renew_every_s))
            self._thread = None
        with self._lock:
            lease, self._lease = self._lease, None
        if release and lease is not None:
            try:
                self.store.release(lease)
                log.info("%s released the leader lease", self.controller_id)
            except Exception as exc:  # noqa: BLE001 - it expires on its own anyway
                log.warning("could not release the leader lease (it expires): %s", exc)
