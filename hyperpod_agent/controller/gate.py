"""The gate: the one way the controller changes Slurm (DESIGN §14, docs/controller.md
"What the controller changes, and when").

The executor, the step-retry surgery, the deep-check runner, their orphan sweeps and
the replacement providers hold a Gate, never the Slurm client (an import-linter
contract keeps it so). Right before each change the gate

1. reads the node (or job) fresh and applies the one owner rule: a node a human or
   another tool drained is never drained, rebooted, resumed or reserved by us, and a
   call that names the reason it expects (``expect``) runs only while the node still has
   it (a compare-and-set on Slurm's state);
2. checks, with several controllers, that this one still holds the leader lease, by
   its fencing token in the store, with enough of it left to finish the call: the call
   is bounded to that time less a clock margin, so it ends before the lease could
   pass to another controller. A controller that lost its lease (paused, partitioned,
   slow) stops there: LeaseLost, and it steps down;
3. logs the call (logger ``hyperpod_agent.controller.gate``) and counts it
   (``hyperpod_gate_calls_total{call,outcome}``).

In ``mode = "observe"`` it makes no call at all: each is logged as "would" and refused.

Reads pass through unchanged. What the gate cannot close: a process frozen between its
check and the moment its ``scontrol`` reaches slurmctld (microseconds, not a lease).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Protocol

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.crash import crash_from_env
from hyperpod_agent.controller.expansion import ExpansionGuard
from hyperpod_agent.controller.providers.base import SlurmApi
from hyperpod_agent.controller.store.lease import Lease, LeaseLost
from hyperpod_agent.errors import SlurmError
from hyperpod_agent.reasons import Owner, owner_of
from hyperpod_agent.slurm.maint import Reservation
from hyperpod_agent.slurm.models import ENDED_STATES, Job, Node

log = logging.getLogger(__name__)

# A call gets at least this long; with less lease left the gate renews it first.
MIN_CALL_S = 1.0
KEEPALIVE_EVERY_S = 5.0
# Owners a node may have for us to take it out of service or put it back.
MAY_CHANGE = (Owner.NONE, Owner.US, Owner.SPARE, Owner.REQUEST, Owner.SLURM)


class Refused(SlurmError):
    """The gate did not make a call: the node or job is not ours to change now.

    A SlurmError, so code that treats any failed call as "nothing changed" stays right;
    callers that know better (abandon the intent, leave the node) catch it first."""

    def __init__(self, call: str, target: str, why: str) -> None:
        super().__init__([call, target], None, "", f"refused: {why}")
        self.why = why


class Lessee(Protocol):
    """What the gate needs of ``Leadership``."""

    def lease(self) -> Lease | None: ...

    def tick(self) -> bool: ...

    def drop(self, why: str) -> None: ...


class LeaseReader(Protocol):
    def lease(self, name: str = ...) -> Lease | None: ...


class Gate:
    """Every Slurm-changing call the controller makes; see the module docstring."""

    def __init__(
        self,
        slurm: SlurmApi,
        *,
        slurm_users: Collection[str] = ("slurm",),
        store: LeaseReader | None = None,
        leadership: Lessee | None = None,
        clock: Callable[[], float] = time.time,
        margin_s: float = 1.0,
    ) -> None:
        self.slurm = slurm
        self.slurm_users = tuple(slurm_users)
        self.store = store
        self.leadership = leadership
        self.clock = clock
        self.margin_s = margin_s
        # Called while a long wait runs (salloc for a spare): the systemd watchdog ping.
        self.keepalive: Callable[[], None] | None = None
        # mode = "observe": the last line of defence. The decisions stop before they
        # reach here (counted as would_have); whatever still does is refused.
        self.observe = False
        # Job expansion only on a slurmctld it was shown safe on (controller/expansion.py).
        self.expansion = ExpansionGuard(slurm, clock)

    # -- reads, unchanged -----------------------------------------------------------
    def slurmctld_version(self) -> str | None:
        return self.slurm.slurmctld_version()

    def list_nodes(self) -> list[Node]:
        return self.slurm.list_nodes()

    def list_jobs(self) -> list[Job]:
        return self.slurm.list_jobs()

    def node(self, name: str) -> Node:
        return self.slurm.node(name)

    def job(self, job_id: int) -> Job | None:
        one = getattr(self.slurm, "job", None)  # one job's read where the backend has it
        if one is not None:
            return one(job_id)  # type: ignore[no-any-return]
        return next((j for j in self.slurm.list_jobs() if j.job_id == job_id), None)

    def reservations(self) -> list[Reservation]:
        return self.slurm.reservations()

    # -- nodes ----------------------------------------------------------------------
    def drain(self, node: str, reason: str, *, expect: Collection[str] | None = None) -> None:
        """Drain ``node``: never one somebody else drained; with ``expect``, only while
        its reason is one of those ('' for a node in service)."""
        self._call(
            "drain",
            node,
            lambda: self.slurm.drain(node, reason),
            reason,
            rule=lambda: self._node_rule("drain", node, expect, also=reason),
        )

    def resume(
        self,
        node: str,
        *,
        expect: Collection[str] | None = None,
        handed: str | None = None,
    ) -> bool:
        """Resume ``node`` while it is drained under a reason we may undo (and, with
        ``expect``, one of those), or under the very reason it had when an admin
        handed it to us (``handed``: an admin's deep check of a node they drained).
        A node somebody resumed already is left alone: False, nothing called."""
        self._admit("resume", node)
        current = self.slurm.node(node)
        if not current.drained:
            log.info("gate: resume %s skipped: it is in service already", node)
            return False
        if handed is None or current.reason.strip() != handed.strip():
            self._node_rule("resume", node, expect, current=current)
        self._call("resume", node, lambda: self.slurm.resume(node))
        return True

    def reboot(
        self,
        node: str,
        reason: str,
        asap: bool = True,
        next_state: str = "resume",
        *,
        expect: Collection[str] | None = None,
    ) -> None:
        self._call(
            "reboot",
            node,
            lambda: self.slurm.reboot(node, reason, asap, next_state),
            reason,
            rule=lambda: self._node_rule("reboot", node, expect, also=reason),
        )

    def _node_rule(
        self,
        call: str,
        name: str,
        expect: Collection[str] | None,
        *,
        also: str = "",
        current: Node | None = None,
    ) -> None:
        node = current if current is not None else self.slurm.node(name)
        reason = node.reason.strip() if node.drained else ""
        if also and node.drained and reason == also.strip():
            return  # already as this call leaves it (a repeat after a crash)
        owner = owner_of(node, self.slurm_users)
        if owner not in MAY_CHANGE:
            self._refuse(call, name, f"{name} is held by somebody else (reason {reason!r})")
        if expect is not None and reason not in {e.strip() for e in expect}:
            self._refuse(call, name, f"{name}'s reason is now {reason!r}, not one we expect")

    # -- jobs -----------------------------------------------------------------------
    def requeue(self, job_id: int) -> None:
        def known() -> None:
            # A job that failed is requeued too (within MinJobAge): it must still exist.
            if self.job(job_id) is None:
                self._refuse("requeue", f"job {job_id}", f"job {job_id} is gone")

        self._call("requeue", f"job {job_id}", lambda: self.slurm.requeue(job_id), rule=known)

    def cancel(self, job_id: int, signal: str | int | None = None) -> None:
        self._call("cancel", f"job {job_id}", lambda: self.slurm.cancel(job_id, signal))

    def shrink_job(self, job_id: int, keep: Sequence[str]) -> None:
        self._call(
            "shrink",
            f"job {job_id}",
            lambda: self.slurm.shrink_job(job_id, keep),
            rule=lambda: self._expandable("shrink", job_id),
        )

    def allocate_expansion(
        self, job_id: int, node: str, wait_s: int, reservation: str | None = None
    ) -> int:
        # Not bounded by the lease: salloc waits for the node on purpose. An allocation
        # granted after this controller lost its lease is a helper of ours the new
        # leader adopts or sweeps (stepretry/orphans.py); the merge itself is gated.
        self._admit("allocate", f"job {job_id}")
        log.info("gate: allocate %s for job %d (waits up to %d s)", node, job_id, wait_s)
        return int(
            self._counted(
                "allocate",
                lambda: self._fed(
                    lambda: self.slurm.allocate_expansion(job_id, node, wait_s, reservation)
                ),
            )
        )

    def _fed(self, fn: Callable[[], Any]) -> Any:
        """``fn`` in a worker thread while this one keeps the watchdog fed, so a wait
        longer than WatchdogSec never gets the controller killed mid-surgery."""
        if self.keepalive is None:
            return fn()
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["result"] = fn()
                crash_from_env("step_retry:salloc")
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                box["error"] = exc

        worker = threading.Thread(target=work, name="gate-wait", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(KEEPALIVE_EVERY_S)
            self.keepalive()
        if "error" in box:
            raise box["error"]
        return box["result"]

    def absorb_expansion(self, job_id: int, helper_id: int) -> None:
        self._call(
            "absorb",
            f"job {job_id}",
            lambda: self.slurm.absorb_expansion(job_id, helper_id),
            rule=lambda: self._expandable("absorb", job_id),
        )

    def submit_batch(self, script: Path, **kwargs: Any) -> int:
        name = str(kwargs.get("job_name", script))
        return int(self._call("submit", name, lambda: self.slurm.submit_batch(script, **kwargs)))

    def _expandable(self, call: str, job_id: int) -> None:
        """A step retry's shrink or merge of a live job, on a slurmctld its expansion is
        safe on, read now: before the shrink (the job would be left short of a node it
        cannot get back) and before the merge (the call that crashes). The helper
        allocation between them changes no job; a refused merge's rollback frees it."""
        why = self.expansion.refusal(fresh=True)
        if why:
            self._refuse(call, f"job {job_id}", why)
        self._live_job(call, job_id)

    def _live_job(self, call: str, job_id: int) -> None:
        job = self.job(job_id)
        if job is None or job.state.upper() in ENDED_STATES:
            state = job.state if job is not None else "gone"
            self._refuse(call, f"job {job_id}", f"job {job_id} is {state}")

    # -- reservations ---------------------------------------------------------------
    def create_maint_reservation(
        self,
        name: str,
        nodes: Sequence[str],
        minutes: int,
        users: Sequence[str],
        *,
        seen: Mapping[str, str] | None = None,
    ) -> None:
        """Reserve ``nodes``: never one somebody else holds, unless it still has the
        reason the caller recorded when an admin asked for it (``seen``)."""

        def free() -> None:
            for node in nodes:
                current = self.slurm.node(node)
                prior = (seen or {}).get(node)
                if (
                    prior is not None
                    and current.drained
                    and current.reason.strip() == prior.strip()
                ):
                    continue
                self._node_rule("reserve", node, None, current=current)

        self._call(
            "reserve",
            name,
            lambda: self.slurm.create_maint_reservation(name, nodes, minutes, users),
            rule=free,
        )

    def delete_reservation(self, name: str) -> bool:
        return bool(self._call("unreserve", name, lambda: self.slurm.delete_reservation(name)))

    # -- providers ------------------------------------------------------------------
    @contextmanager
    def provider_call(self, what: str, node: str) -> Iterator[None]:
        """Around a provider's own change (an admin's replace command): fenced and
        logged like a Slurm call. Not bounded: the provider has its own timeout."""
        self._admit(what, node)
        log.info("gate: %s %s", what, node)
        yield

    # -- the fence --------------------------------------------------------------------
    def _call(
        self,
        call: str,
        target: str,
        fn: Callable[[], Any],
        reason: str = "",
        rule: Callable[[], None] | None = None,
    ) -> Any:
        """Lease first (a deposed leader does not even read), then the owner rule on a
        fresh read, then the call within what is left of the lease."""
        left = self._admit(call, target)
        if rule is not None:
            started = self.clock()
            rule()
            if left is not None:
                left -= self.clock() - started
                if left < MIN_CALL_S:
                    left = self._admit(call, target)
        bound = getattr(self.slurm, "bounded", None)
        why = f" reason={reason!r}" if reason else ""
        if left is None:
            log.info("gate: %s %s%s", call, target, why)
        else:
            log.info("gate: %s %s%s (%.1f s of lease left)", call, target, why, left)
        with bound(left) if bound is not None and left is not None else nullcontext():
            return self._counted(call, fn)

    def _counted(self, call: str, fn: Callable[[], Any]) -> Any:
        try:
            result = fn()
        except SlurmError:
            metrics.GATE_CALLS.labels(call, "failed").inc()
            raise
        metrics.GATE_CALLS.labels(call, "done").inc()
        return result

    def _admit(self, call: str, target: str) -> float | None:
        """The time this call may take; LeaseLost when this controller must not act.
        None without [ha] (one controller: nothing to fence). Refused in observe mode."""
        if self.observe:
            log.info("gate: would %s %s (observe mode)", call, target)
            metrics.GATE_CALLS.labels(call, "would_have").inc()
            raise Refused(call, target, 'mode = "observe": the controller changes nothing')
        if self.leadership is None:
            return None
        left, why = self._lease_left()
        if why is None and left < MIN_CALL_S:
            self.leadership.tick()  # renew now rather than give up a healthy lease
            left, why = self._lease_left()
        if why is not None or left < MIN_CALL_S:
            self._lost(call, target, why or f"only {max(left, 0.0):.1f} s of the lease left")
        return left

    def _lease_left(self) -> tuple[float, str | None]:
        """Seconds of lease left less the clock margin, by this controller's copy and
        the store's row (token compared); or why there is none."""
        assert self.leadership is not None
        lease = self.leadership.lease()
        if lease is None:
            return 0.0, "this controller does not lead"
        now = self.clock()
        stored = self.store.lease(lease.name) if self.store is not None else lease
        if stored is None or (stored.holder, stored.token) != (lease.holder, lease.token):
            holder = stored.holder or "nobody" if stored is not None else "nobody"
            return 0.0, f"the lease is {holder}'s now (our token {lease.token})"
        return min(lease.expires_at, stored.expires_at) - now - self.margin_s, None

    def _lost(self, call: str, target: str, why: str) -> None:
        metrics.GATE_CALLS.labels(call, "lease_lost").inc()
        log.warning("gate: %s %s NOT made: %s; this controller stops acting", call, target, why)
        assert self.leadership is not None
        self.leadership.drop(f"{call} {target}: {why}")
        raise LeaseLost(f"{call} {target} not made: {why}")

    def _refuse(self, call: str, target: str, why: str) -> None:
        metrics.GATE_CALLS.labels(call, "refused").inc()
        log.warning("gate: %s %s refused: %s", call, target, why)
        raise Refused(call, target, why)


def gated(slurm: SlurmApi | Gate, slurm_users: Collection[str]) -> Gate:
    """``slurm`` behind a gate (the one it already is): a runner built without the
    service (a test, a tool) still keeps the owner rule."""
    return slurm if isinstance(slurm, Gate) else Gate(slurm, slurm_users=slurm_users)
