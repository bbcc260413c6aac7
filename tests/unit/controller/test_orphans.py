"""Jobs and reservations named like ours: a helper allocation or a check job is ours
only by its whole name (ASCII digits, bounded) and its owner (this controller's uid, as
Slurm records it). Anything else is left alone, never cancelled, and one item that
raises never stops the pass: each surgery, check run and orphan goes through the
service's Isolation."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from ctl_helpers import NOW, FakeSlurm, cluster, config, node

from hyperpod_agent.controller.config_deep import DeepCheckConfig
from hyperpod_agent.controller.deepcheck.run import CheckRunner
from hyperpod_agent.controller.isolation import Isolation
from hyperpod_agent.controller.stepretry.run import StepRetryRunner
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.slurm.maint import Reservation
from hyperpod_agent.slurm.models import Job
from hyperpod_agent.slurm.resize import expansion_parent

ME = os.getuid()
ATTACKER = 4242  # an ordinary user's uid
SPARE = "hyperpod:spare"
MAINT = frozenset({"MAINT"})


class OwnedSlurm(FakeSlurm):
    """The in-memory Slurm, with what the real one records: the jobs the controller
    makes (check jobs, helper allocations) are owned by its uid."""

    def _stamp(self, before: set[int]) -> None:
        for jid in set(self.jobs) - before:
            self.jobs[jid] = replace(self.jobs[jid], uid=ME, user="root")

    def submit_batch(self, script: Path, **kwargs: object) -> int:
        before = set(self.jobs)
        try:
            return super().submit_batch(script, **kwargs)  # type: ignore[arg-type]
        finally:
            self._stamp(before)

    def allocate_expansion(
        self, job_id: int, node: str, wait_s: int, reservation: str | None = None
    ) -> int:
        before = set(self.jobs)
        try:
            return super().allocate_expansion(job_id, node, wait_s, reservation)
        finally:
            self._stamp(before)


def theirs(job_id: int, name: str, state: str = "PENDING", nodes: Sequence[str] = ()) -> Job:
    """A job an ordinary user submitted (``sbatch -H -J NAME --wrap true``)."""
    return Job(
        job_id=job_id,
        name=name,
        state=state,
        state_reason="JobHeldUser" if state == "PENDING" else "",
        nodes=tuple(nodes),
        user="hp-attacker",
        uid=ATTACKER,
    )


def ours(job_id: int, name: str, state: str = "PENDING", nodes: Sequence[str] = ()) -> Job:
    return Job(job_id=job_id, name=name, state=state, nodes=tuple(nodes), user="root", uid=ME)


class Events:
    """What the service's Isolation records (store.add_event's signature)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, kind: str, message: str, now: float, **_: object) -> int:
        self.seen.append((kind, message))
        return len(self.seen)


# --- step retry: the helper allocations ------------------------------------------------

PLAN = {
    "bad_node": "node2",
    "spare": "node5",
    "reason": "hyperpod:replace gpu3 xid79 boom",
    "keep": ["node1", "node3"],
    "cause": "gpu3 xid79 on node2: node5 stands in",
}


def surgery_world() -> OwnedSlurm:
    nodes = cluster(4)
    for n in ("node1", "node2", "node3"):
        nodes[n] = replace(nodes[n], state="ALLOCATED")
    nodes["node5"] = node("node5", flags=("DRAIN",), reason=SPARE)
    job = Job(job_id=12, name="train", state="RUNNING", nodes=("node1", "node2", "node3"))
    return OwnedSlurm(nodes, [job])


def start(store: Store, job_id: int = 12, plan: Mapping[str, object] | None = None) -> int:
    event = EventIn("step_retry_planned", "planned", "node2", job_id, "test")
    run_id, _ = store.add_step_retry(job_id, "0", 1, 3, plan or PLAN, "test", NOW, event)
    return run_id


def steps(store: Store, slurm: FakeSlurm, isolation: Isolation | None = None) -> StepRetryRunner:
    if isolation is None:  # the runner's own
        return StepRetryRunner(store, slurm, config(), sleep=lambda _s: None)
    return StepRetryRunner(store, slurm, config(), sleep=lambda _s: None, isolation=isolation)


@pytest.mark.parametrize(
    "name",
    [
        "hyperpod-expand-²",  # str.isdigit() says yes, int() says no
        "hyperpod-expand-١٢",  # Arabic-Indic digits: int() reads 12
        "hyperpod-expand-12",  # exactly the name of the surgery's helper
        "hyperpod-expand-99",
        "hyperpod-expand-12 ",
        "hyperpod-expand-+12",
        "hyperpod-expand-1_2",  # int() reads 12
        "hyperpod-expand-" + "9" * 40,
        "hyperpod-expand-",
    ],
)
def test_a_users_job_named_like_a_helper_stops_nothing_and_is_never_cancelled(
    store: Store, name: str
) -> None:
    slurm = surgery_world()
    slurm.jobs[30] = theirs(30, name)
    run_id = start(store)
    steps(store, slurm).advance(NOW + 1)  # raised ValueError for '²' before
    run = store.step_retry(run_id)
    assert run is not None and (run.phase, run.outcome) == ("done", "RETRYSTEP")
    assert slurm.jobs[30] == theirs(30, name)
    assert ("cancel", 30) not in slurm.calls


def test_a_running_users_job_with_the_helpers_name_is_not_adopted(store: Store) -> None:
    slurm = surgery_world()
    run_id = start(store)
    # as if the user's job got the spare first: a helper we did not make
    slurm.jobs[30] = theirs(30, "hyperpod-expand-12", "RUNNING", ["node5"])
    steps(store, slurm).advance(NOW + 1)
    run = store.step_retry(run_id)
    assert run is not None and run.helper_id != 30
    assert ("absorb", 12, 30) not in slurm.calls and ("cancel", 30) not in slurm.calls


def test_only_our_own_left_over_helpers_are_cancelled(store: Store) -> None:
    slurm = surgery_world()
    slurm.jobs[12] = replace(slurm.jobs[12], state="COMPLETED")
    slurm.jobs[40] = ours(40, "hyperpod-expand-12", "RUNNING", ["node5"])
    slurm.jobs[41] = ours(41, "hyperpod-expand-99")
    slurm.jobs[42] = theirs(42, "hyperpod-expand-99")
    slurm.jobs[43] = ours(43, "hyperpod-expand-99x")
    assert steps(store, slurm).orphans.sweep(NOW) == 2
    assert [slurm.jobs[i].state for i in (40, 41, 42, 43)] == [
        "CANCELLED",
        "CANCELLED",
        "PENDING",
        "PENDING",
    ]


@pytest.mark.parametrize(
    ("name", "users", "deleted"),
    [
        ("hyperpod-expand-12", ("root",), True),
        ("hyperpod-expand-12", ("alice",), False),  # a site's, for someone else
        ("hyperpod-expand-²", ("root",), False),
        ("hyperpod-expand-12-extra", ("root",), False),
    ],
)
def test_only_our_own_left_over_spare_reservations_are_deleted(
    store: Store, name: str, users: tuple[str, ...], deleted: bool
) -> None:
    slurm = surgery_world()
    slurm.resv[name] = Reservation(name, ("node5",), MAINT, users, "ACTIVE")
    steps(store, slurm).advance(NOW)
    assert (name not in slurm.resv) is deleted


def test_one_surgery_that_raises_leaves_the_others_and_the_pass_going(store: Store) -> None:
    nodes = cluster(10)
    for n in ("node1", "node2", "node3", "node4", "node5", "node6"):
        nodes[n] = replace(nodes[n], state="ALLOCATED")
    for n in ("node9", "node10"):
        nodes[n] = node(n, flags=("DRAIN",), reason=SPARE)
    slurm = OwnedSlurm(
        nodes,
        [
            Job(job_id=12, name="a", state="RUNNING", nodes=("node1", "node2", "node3")),
            Job(job_id=13, name="b", state="RUNNING", nodes=("node4", "node5", "node6")),
        ],
    )
    first = start(store, 12, {**PLAN, "spare": "node9"})
    plan = {**PLAN, "bad_node": "node5", "spare": "node10", "keep": ["node4", "node6"]}
    second = start(store, 13, plan)
    shrink = slurm.shrink_job

    def buggy(job_id: int, keep: Sequence[str]) -> None:
        if job_id == 12:
            raise KeyError("a bug met by one surgery only")
        shrink(job_id, keep)

    slurm.shrink_job = buggy  # type: ignore[method-assign]
    events = Events()
    iso = Isolation(events, lambda: NOW)
    steps(store, slurm, iso).advance(NOW + 1)
    done = store.step_retry(second)
    stuck = store.step_retry(first)
    assert done is not None and done.outcome == "RETRYSTEP"
    assert stuck is not None and stuck.phase == "shrink"  # tried again next pass
    assert [k for k, _ in events.seen] == ["item_error"]
    assert events.seen[0][1].startswith(f"surgery {first}: skipped this pass: KeyError")


def test_an_orphan_that_raises_leaves_the_surgery_going(store: Store) -> None:
    slurm = surgery_world()
    slurm.jobs[41] = ours(41, "hyperpod-expand-99")
    cancel = slurm.cancel

    def buggy(job_id: int, signal: str | int | None = None) -> None:
        if job_id == 41:
            raise RuntimeError("a bug met by one orphan only")
        cancel(job_id, signal)

    slurm.cancel = buggy  # type: ignore[method-assign]
    events = Events()
    run_id = start(store)
    steps(store, slurm, Isolation(events, lambda: NOW)).advance(NOW + 1)
    run = store.step_retry(run_id)
    assert run is not None and run.outcome == "RETRYSTEP"
    assert [m.split(":")[0] for _, m in events.seen] == ["orphan job 41"]


def test_helper_names_are_ascii_digits_within_bounds() -> None:
    assert expansion_parent("hyperpod-expand-12") == 12
    assert expansion_parent("hyperpod-expand-4294967295") == 4294967295
    for name in ("hyperpod-expand-²", "hyperpod-expand-١٢", "hyperpod-expand-12345678901",
                 "xhyperpod-expand-1", "hyperpod-expand-1\n", "HYPERPOD-EXPAND-1"):  # fmt: skip
        assert expansion_parent(name) is None, name


# --- deep checks: left-over reservations and the runs ------------------------------------

SUITE = """
[[checks]]
name = "dcgm"
kind = "dcgm"
timeout_s = 60
"""


def check_runner(
    tmp_path: Path, store: Store, slurm: FakeSlurm, iso: Isolation | None = None
) -> CheckRunner:
    suite = tmp_path / "suite.toml"
    suite.write_text(SUITE)
    deep = DeepCheckConfig(suite=suite, results_dir=tmp_path / "results")
    if iso is None:  # the runner's own
        return CheckRunner(store, slurm, deep, ("root",))
    return CheckRunner(store, slurm, deep, ("root",), isolation=iso)


def plan_check(store: Store, slurm: FakeSlurm, nodes: list[str], at: float = NOW) -> int:
    prior = {n: slurm.nodes[n].reason for n in nodes}
    event = EventIn("deep_check_planned", "planned")
    return store.add_check_run(nodes, "quick", "admin", prior, "test", False, at, event)


def test_the_sweep_cancels_only_our_job_in_a_left_over_reservation(
    tmp_path: Path, store: Store
) -> None:
    slurm = OwnedSlurm(cluster(4))
    name = "hyperpod-check-9-123"
    slurm.resv[name] = Reservation(name, ("node1",), MAINT, ("root",), "ACTIVE")
    slurm.jobs[50] = ours(50, name, "RUNNING", ["node1"])
    slurm.jobs[51] = theirs(51, name)
    runner = check_runner(tmp_path, store, slurm)
    runner.advance(slurm.nodes, list(slurm.jobs.values()), NOW)
    assert ("cancel", 50) in slurm.calls and ("cancel", 51) not in slurm.calls
    assert slurm.jobs[51] == theirs(51, name) and name not in slurm.resv


@pytest.mark.parametrize(
    ("name", "users"),
    [
        ("hyperpod-check-²-1", ("root",)),
        ("hyperpod-check-9-123-x", ("root",)),
        ("hyperpod-check-9", ("root",)),
        ("hyperpod-check-9-123", ("alice",)),  # made for someone else: not ours
    ],
)
def test_reservations_not_wholly_ours_are_left_alone(
    tmp_path: Path, store: Store, name: str, users: tuple[str, ...]
) -> None:
    slurm = OwnedSlurm(cluster(4))
    slurm.resv[name] = Reservation(name, ("node1",), MAINT, users, "ACTIVE")
    runner = check_runner(tmp_path, store, slurm)
    runner.advance(slurm.nodes, [], NOW)
    assert name in slurm.resv and not slurm.nodes["node1"].drained


def test_one_check_run_that_raises_leaves_the_others_going(tmp_path: Path, store: Store) -> None:
    slurm = OwnedSlurm(cluster(4))
    first = plan_check(store, slurm, ["node1"])
    second = plan_check(store, slurm, ["node2"])
    create = slurm.create_maint_reservation

    def buggy(name: str, nodes: Sequence[str], minutes: int, users: Sequence[str]) -> None:
        if nodes == ["node1"] or tuple(nodes) == ("node1",):
            raise IndexError("a bug met by one run only")
        create(name, nodes, minutes, users)

    slurm.create_maint_reservation = buggy  # type: ignore[method-assign]
    events = Events()
    runner = check_runner(tmp_path, store, slurm, Isolation(events, lambda: NOW))
    runner.advance(slurm.nodes, list(slurm.jobs.values()), NOW + 1)
    ran, stuck = store.check_run(second), store.check_run(first)
    assert ran is not None and ran.phase == "running"
    assert stuck is not None and stuck.phase == "reserve"  # tried again next pass
    assert [k for k, _ in events.seen] == ["item_error"]
    assert events.seen[0][1].startswith(f"check_run {first}: skipped this pass: IndexError")


def test_a_run_that_keeps_raising_is_quarantined_and_forgotten_once_done(
    tmp_path: Path, store: Store
) -> None:
    slurm = OwnedSlurm(cluster(4))
    run_id = plan_check(store, slurm, ["node1"])
    slurm.create_maint_reservation = lambda *a: 1 / 0  # type: ignore[assignment,method-assign]
    iso = Isolation(Events(), lambda: NOW)
    runner = check_runner(tmp_path, store, slurm, iso)
    for t in range(3):
        runner.advance(slurm.nodes, [], NOW + t)
    assert iso.quarantined() == [f"check_run {run_id}"]
    store.set_check_phase(run_id, "done", NOW + 5)  # e.g. ended by an admin
    runner.advance(slurm.nodes, [], NOW + 6)
    assert iso.quarantined() == []
