"""The gate: every Slurm change checks the owner rule, the lease and logs itself.

The human-drain and deposed-leader cases here each changed Slurm before the gate."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
from ctl_helpers import NOW, FakeSlurm, cluster, config, node
from test_stepretry_run import REASON, fake, run_of, start

from hyperpod_agent.controller.gate import MIN_CALL_S, Gate, Refused
from hyperpod_agent.controller.leadership import Leadership
from hyperpod_agent.controller.stepretry.run import StepRetryRunner
from hyperpod_agent.controller.store.checks import PhaseMoved
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.lease import LeaseLost

HUMAN = "RMA 1234: cable"


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class BoundSlurm(FakeSlurm):
    """Records the time bound each change ran under."""

    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.bounds: list[float] = []

    @contextmanager
    def bounded(self, seconds: float) -> Iterator[None]:
        self.bounds.append(seconds)
        yield


def human(slurm: FakeSlurm, name: str, reason: str = HUMAN) -> None:
    slurm.nodes[name] = replace(slurm.nodes[name], flags=frozenset({"DRAIN"}), reason=reason)


def changes(slurm: FakeSlurm) -> list[tuple[object, ...]]:
    return [c for c in slurm.calls if c[0] in ("drain", "resume", "reboot", "requeue", "cancel")]


# -- the owner rule -----------------------------------------------------------------
def test_a_node_a_human_drained_is_never_drained_rebooted_resumed_or_reserved() -> None:
    slurm = FakeSlurm(cluster(3))
    human(slurm, "node1")
    gate = Gate(slurm)
    for call in (
        lambda: gate.drain("node1", "hyperpod:drain gpu0 xid79 x"),
        lambda: gate.reboot("node1", "hyperpod:reboot gpu0 xid79 x"),
        lambda: gate.resume("node1"),
        lambda: gate.create_maint_reservation("hyperpod-check-1-1", ["node1"], 10, ["root"]),
    ):
        with pytest.raises(Refused, match="held by somebody else"):
            call()
    assert changes(slurm) == [] and slurm.resv == {}


def test_ours_slurms_and_an_admin_request_may_be_changed() -> None:
    slurm = FakeSlurm(cluster(4))
    human(slurm, "node1", "hyperpod:drain gpu0 xid79 x")
    human(slurm, "node2", "Not responding")
    human(slurm, "node3", "Action:Replace")
    gate = Gate(slurm)
    for name in ("node1", "node2", "node3", "node4"):
        gate.drain(name, "hyperpod:replace gpu0 xid79 x")
    assert len(changes(slurm)) == 4


def test_expect_is_a_compare_and_set_on_the_nodes_reason() -> None:
    slurm = FakeSlurm(cluster(2))
    human(slurm, "node1", "hyperpod:drain gpu0 xid79 x")
    gate = Gate(slurm)
    with pytest.raises(Refused, match="not one we expect"):
        gate.drain("node1", "hyperpod:reboot gpu0 xid79 x", expect=("",))
    gate.drain("node2", "hyperpod:reboot gpu0 xid79 x", expect=("",))
    assert changes(slurm) == [("drain", "node2", "hyperpod:reboot gpu0 xid79 x")]


def test_a_node_somebody_resumed_is_not_resumed_again() -> None:
    slurm = FakeSlurm(cluster(1))
    assert Gate(slurm).resume("node1") is False
    assert changes(slurm) == []


def test_an_admin_may_hand_over_the_node_they_drained_as_it_is() -> None:
    slurm = FakeSlurm(cluster(1))
    human(slurm, "node1")
    assert Gate(slurm).resume("node1", handed=HUMAN) is True
    human(slurm, "node1", "another admin's reason")
    with pytest.raises(Refused):
        Gate(slurm).resume("node1", handed=HUMAN)


def test_a_requeue_of_a_job_slurm_forgot_and_a_shrink_of_an_ended_job_are_refused() -> None:
    slurm = fake()
    slurm.jobs[12] = replace(slurm.jobs[12], state="COMPLETED")
    gate = Gate(slurm)
    with pytest.raises(Refused, match="job 12 is COMPLETED"):
        gate.shrink_job(12, ["node1"])
    gate.requeue(12)  # an ended job may still be requeued within MinJobAge
    with pytest.raises(Refused, match="gone"):
        gate.requeue(99)


# -- the lease ----------------------------------------------------------------------
def leader(store: Store, name: str, clock: Clock) -> Leadership:
    lead = Leadership(store, name, ttl_s=6.0, renew_every_s=2.0, clock=clock)
    assert lead.tick()
    return lead


def test_a_call_is_bounded_to_the_lease_left_less_the_margin(store: Store) -> None:
    clock = Clock()
    slurm = BoundSlurm(cluster(1))
    gate = Gate(slurm, store=store, leadership=leader(store, "a", clock), clock=clock)
    clock.t += 1.0
    gate.drain("node1", "hyperpod:drain gpu0 xid79 x")
    assert slurm.bounds == [pytest.approx(6.0 - 1.0 - 1.0)]


def test_a_leader_whose_lease_passed_on_makes_no_call_and_steps_down(store: Store) -> None:
    # A leader frozen (SIGSTOP, GC) while the standby took over; its own clock lags
    # (skew), so by its copy of the lease it still leads: the store says otherwise.
    clock_a, clock_b = Clock(), Clock(NOW + 7.0)
    a = leader(store, "a", clock_a)
    b = leader(store, "b", clock_b)
    assert store.lease() is not None and store.lease().holder == "b"  # type: ignore[union-attr]
    slurm = FakeSlurm(cluster(1))
    gate = Gate(slurm, store=store, leadership=a, clock=clock_a)
    clock_a.t += 0.5
    assert a.lease() is not None  # its own view is still "leading"
    with pytest.raises(LeaseLost, match="b's now"):
        gate.drain("node1", "hyperpod:drain gpu0 xid79 x")
    assert changes(slurm) == [] and not a.is_leader()
    assert b.is_leader()


def test_a_leader_woken_after_its_lease_ended_makes_no_call(store: Store) -> None:
    clock = Clock()
    lead = leader(store, "a", clock)
    slurm = FakeSlurm(cluster(1))
    gate = Gate(slurm, store=store, leadership=lead, clock=clock)
    clock.t += 12.0  # frozen for 2 x lease
    with pytest.raises(LeaseLost):
        gate.requeue(1)
    assert changes(slurm) == []


def test_a_lease_about_to_end_is_renewed_before_the_call(store: Store) -> None:
    clock = Clock()
    lead = leader(store, "a", clock)
    slurm = BoundSlurm(cluster(1))
    gate = Gate(slurm, store=store, leadership=lead, clock=clock, margin_s=2.5)
    clock.t += 3.5  # 2.5 s left: less than the margin plus the shortest call
    gate.drain("node1", "hyperpod:drain gpu0 xid79 x")
    assert slurm.bounds and slurm.bounds[0] >= MIN_CALL_S


# -- phases: compare-and-set, fenced ----------------------------------------------------
def test_a_phase_write_from_a_stale_read_writes_nothing(store: Store) -> None:
    run_id = start(store)
    store.set_step_phase(run_id, "shrink", NOW + 1, expect="drain")
    with pytest.raises(PhaseMoved, match="'shrink' now, not 'drain'"):
        store.set_step_phase(
            run_id,
            "rollback",
            NOW + 2,
            expect="drain",
            actions=[{"kind": "requeue", "job_id": 12, "cause": "x", "state": "intent"}],
        )
    assert run_of(store, run_id).phase == "shrink"
    assert store.open_actions() == []


def test_a_deposed_leader_waking_mid_surgery_writes_nothing_over_the_new_ones(
    store: Store,
) -> None:
    """The old leader read the surgery at ``expand``, froze; the new leader finished
    it; the old one wakes and its expansion fails: before, it wrote ``rollback`` and a
    requeue intent over the finished surgery (done RETRYSTEP, then failed REQUEUE)."""
    clock_a, clock_b = Clock(), Clock(NOW + 7.0)
    a = leader(store, "a", clock_a)
    run_id = start(store)
    slurm = fake()
    old = StepRetryRunner(store, slurm, config(), sleep=lambda _s: None)
    old.fence = a.lease()
    stale = run_of(store, run_id)
    b = leader(store, "b", clock_b)
    new = StepRetryRunner(store, slurm, config(), sleep=lambda _s: None)
    new.fence = b.lease()
    new.advance(NOW + 7.0)
    assert run_of(store, run_id).phase == "done"
    slurm.fail_next["expand"] = 1
    with pytest.raises(LeaseLost):
        old._fail(stale, "the expansion failed", NOW + 8.0)
    old.fence = None  # even unfenced, the phase it read is gone
    with pytest.raises(PhaseMoved):
        old._fail(stale, "the expansion failed", NOW + 8.0)
    done = run_of(store, run_id)
    assert (done.phase, done.outcome) == ("done", "RETRYSTEP")
    assert [r.kind for r in store.open_actions()] == []


# -- human drains on every path -----------------------------------------------------
def test_a_rollback_puts_the_spare_back_before_its_reservation_goes(store: Store) -> None:
    slurm = fake()
    slurm.fail_next["expand"] = 1
    start(store)
    StepRetryRunner(store, slurm, config(), sleep=lambda _s: None).advance(NOW + 1)
    order = [c[0] for c in slurm.calls if c[:2] in (("drain", "node5"), ("unreserve",))]
    names = [c for c in slurm.calls if c[0] in ("drain", "delete_reservation")]
    drain_at = next(i for i, c in enumerate(slurm.calls) if c[:2] == ("drain", "node5"))
    gone_at = next(i for i, c in enumerate(slurm.calls) if c[0] == "delete_reservation")
    assert drain_at < gone_at, (order, names)
    assert slurm.nodes["node5"].reason == "hyperpod:spare"


def test_a_bad_node_a_human_took_during_the_surgery_is_left_to_them(store: Store) -> None:
    slurm = fake()
    human(slurm, "node2")
    start(store)
    StepRetryRunner(store, slurm, config(), sleep=lambda _s: None).advance(NOW + 1)
    assert slurm.nodes["node2"].reason == HUMAN
    assert not [c for c in slurm.calls if c[0] == "drain" and c[1] == "node2"]
    assert REASON not in {n.reason for n in slurm.nodes.values()}


def test_the_spare_pool_never_replaces_a_node_a_human_drained(store: Store) -> None:
    from hyperpod_agent.controller.actions import Executor
    from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
    from hyperpod_agent.controller.snapshot import Decision, Kind, PlannedAction

    nodes = cluster(3)
    nodes["node3"] = node("node3", flags=("DRAIN",), reason="hyperpod:spare")
    slurm = FakeSlurm(nodes)
    gate = Gate(slurm)
    executor = Executor(store, gate, SparePoolProvider(gate), config())
    human(slurm, "node1")
    # planned against a view taken before the human's drain (or given their reason
    # as the one it "saw", as the deep-check escalation did)
    action = PlannedAction(
        Kind.REPLACE,
        "node1",
        "hyperpod:replace deep-check nccl x",
        "deep check nccl FAIL",
        params={"seen_reason": HUMAN},
    )
    executor.execute(Decision([action]), dict(slurm.nodes), [], NOW)
    assert slurm.nodes["node1"].reason == HUMAN
    assert slurm.nodes["node3"].reason == "hyperpod:spare"
    assert [a.state for a in store.node_actions("node1")] == ["abandoned"]


def test_a_long_wait_for_a_spare_keeps_the_watchdog_fed() -> None:
    import threading

    from hyperpod_agent.controller import gate as gate_module

    release = threading.Event()
    pings: list[int] = []

    class Waiting(FakeSlurm):
        def allocate_expansion(
            self, job_id: int, node: str, wait_s: int, reservation: str | None = None
        ) -> int:
            assert release.wait(10)  # salloc, waiting for the node
            return 77

    gate = Gate(Waiting(cluster(1)))

    def ping() -> None:
        pings.append(1)
        if len(pings) == 3:
            release.set()

    gate.keepalive = ping
    old, gate_module.KEEPALIVE_EVERY_S = gate_module.KEEPALIVE_EVERY_S, 0.01
    try:
        assert gate.allocate_expansion(12, "node5", 300) == 77
    finally:
        gate_module.KEEPALIVE_EVERY_S = old
    assert len(pings) >= 3
