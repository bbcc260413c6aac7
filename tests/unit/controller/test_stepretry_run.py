"""The step-retry surgery on the in-memory Slurm: each phase, each failure's rollback,
and a controller killed after each Slurm step finishing exactly once on restart."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from ctl_helpers import NOW, FakeSlurm, cluster, config, node
from test_orphans import ME, OwnedSlurm

from hyperpod_agent.controller.actions import Executor
from hyperpod_agent.controller.api.views import step_retry_view
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
from hyperpod_agent.controller.stepretry.run import ENDED, StepRetryRunner
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import EventIn, TrackedJob
from hyperpod_agent.controller.store.steps import StepRetry
from hyperpod_agent.slurm.models import Job, Node

REASON = "hyperpod:replace gpu3 xid79 boom"
PLAN = {
    "bad_node": "node2",
    "spare": "node5",
    "reason": REASON,
    "keep": ["node1", "node3"],
    "cause": "gpu3 xid79 on node2: node5 stands in",
}


class Crash(BaseException):
    """The controller dies here (as os._exit would: nothing of the pass catches it)."""


def fake() -> FakeSlurm:
    nodes = cluster(4)
    for n in ("node1", "node2", "node3"):
        nodes[n] = replace(nodes[n], state="ALLOCATED")
    nodes["node5"] = node("node5", flags=("DRAIN",), reason="hyperpod:spare")
    job = Job(job_id=12, name="train", state="RUNNING", nodes=("node1", "node2", "node3"))
    return OwnedSlurm(nodes, [job])


def start(store: Store, attempt: int = 1) -> int:
    event = EventIn("step_retry_planned", "planned", "node2", 12, "test")
    run_id, new = store.add_step_retry(12, "0", attempt, 3, PLAN, "test", NOW, event)
    assert new
    return run_id


def runner(store: Store, slurm: FakeSlurm, crash_at: str = "") -> StepRetryRunner:
    def hook(point: str) -> None:
        if point == crash_at:
            raise Crash(point)

    return StepRetryRunner(store, slurm, config(), crash_hook=hook, sleep=lambda _s: None)


def live_helpers(slurm: FakeSlurm) -> list[Job]:
    return [
        j
        for j in slurm.jobs.values()
        if j.name == "hyperpod-expand-12" and j.state.upper() not in ENDED
    ]


def run_of(store: Store, run_id: int) -> StepRetry:
    run = store.step_retry(run_id)
    assert run is not None
    return run


def test_the_surgery_merges_the_spare_into_the_same_running_job(store: Store) -> None:
    slurm = fake()
    run_id = start(store)
    assert runner(store, slurm).advance(NOW + 1) == 1
    run = run_of(store, run_id)
    assert (run.phase, run.outcome, run.new_nodes) == (
        "done",
        "RETRYSTEP",
        ("node1", "node3", "node5"),
    )
    job = slurm.jobs[12]
    assert (job.state, job.nodes, job.restart_count) == ("RUNNING", ("node1", "node3", "node5"), 0)
    assert slurm.nodes["node2"].reason == REASON and slurm.nodes["node2"].drained
    assert not slurm.nodes["node5"].drained  # out of the pool, in the job
    # the spare is reserved for the job before it leaves the pool: a job waiting for
    # nodes cannot take it between its resume and the helper allocation
    assert [c[0] for c in slurm.calls] == [
        "drain",
        "shrink",
        "create_reservation",
        "resume",
        "expand",
        "absorb",
        "cancel",
        "delete_reservation",
    ]
    assert ("create_reservation", "hyperpod-expand-12", ("node5",)) in slurm.calls
    assert [c for c in slurm.calls if c[0] == "expand"] == [
        ("expand", 12, "node5", "hyperpod-expand-12")
    ]
    assert slurm.resv == {}
    assert live_helpers(slurm) == []
    kinds = [e.kind for e in store.events(job_id=12)]
    assert kinds == [
        "step_retry_planned", "step_retry_drain", "step_retry_shrink", "step_retry_expand",
        "step_retry_absorb", "step_retry_done",
    ]  # fmt: skip
    assert all(" s" in e.message and " in " in e.message for e in store.events(job_id=12)[1:5])
    # the bad node is held for repair as the replace path leaves it: replaced by the spare
    assert store.replaced_nodes() == {"node2"}
    assert store.step_retries_done(12, "0") == 1
    assert store.open_step_retries() == []


def test_a_fault_on_the_batch_host_keeps_it_in_the_job_drained(store: Store) -> None:
    """Slurm never removes a batch host: no shrink, the spare merged beside it."""
    slurm = fake()
    slurm.jobs[12] = replace(slurm.jobs[12], batch_host="node2")
    event = EventIn("step_retry_planned", "planned", "node2", 12, "test")
    plan = {**PLAN, "keep": ["node1", "node2", "node3"]}
    run_id, _ = store.add_step_retry(12, "0", 1, 3, plan, "test", NOW, event)
    assert runner(store, slurm).advance(NOW + 1) == 1
    run = run_of(store, run_id)
    assert (run.phase, run.outcome) == ("done", "RETRYSTEP")
    assert run.new_nodes == ("node1", "node2", "node3", "node5")  # Slurm's job, as it is
    assert slurm.jobs[12].nodes == ("node1", "node2", "node3", "node5")
    assert "shrink" not in [c[0] for c in slurm.calls]
    assert slurm.nodes["node2"].reason == REASON and slurm.nodes["node2"].drained
    assert store.replaced_nodes() == {"node2"}
    # what the step's helper is told: run on the others and the spare, not on node2
    answer = step_retry_view(run)
    assert (answer.decision, answer.nodelist, answer.nnodes) == ("RETRYSTEP", "node[1,3,5]", 3)
    assert (answer.exclude, answer.rdzv_host) == ("node2", "node1")
    plain = step_retry_view(replace(run, keep=("node1", "node3")))
    assert plain.exclude == "" and plain.nnodes == 4  # the shrunk job's own list


@pytest.mark.parametrize("phase", ["drain", "shrink", "expand", "absorb"])
def test_a_controller_killed_after_each_step_finishes_once(store: Store, phase: str) -> None:
    slurm = fake()
    run_id = start(store)
    with pytest.raises(Crash):
        runner(store, slurm, crash_at=phase).advance(NOW + 1)
    assert run_of(store, run_id).phase == phase  # the store says what to do again
    runner(store, slurm).advance(NOW + 2)  # the restarted controller
    run = run_of(store, run_id)
    assert (run.phase, run.outcome) == ("done", "RETRYSTEP")
    assert slurm.jobs[12].nodes == ("node1", "node3", "node5")
    assert live_helpers(slurm) == []
    assert slurm.names("expand") == [12]  # one helper allocation, adopted after the crash
    assert store.step_retries_done(12, "0") == 1
    assert [a.node for a in store.node_actions("node2") if a.kind == "replace"] == ["node2"]


def test_a_helper_left_pending_by_a_dead_salloc_is_cancelled_and_asked_again(
    store: Store,
) -> None:
    slurm = fake()
    run_id = start(store)
    with pytest.raises(Crash):
        runner(store, slurm, crash_at="shrink").advance(NOW + 1)
    slurm.resume("node5")
    slurm.jobs[40] = Job(job_id=40, name="hyperpod-expand-12", state="PENDING", uid=ME)
    runner(store, slurm).advance(NOW + 2)
    assert slurm.jobs[40].state == "CANCELLED"
    assert (run_of(store, run_id).outcome, live_helpers(slurm)) == ("RETRYSTEP", [])


def test_an_expansion_refused_rolls_back_and_requeues_the_shrunk_job(store: Store) -> None:
    slurm = fake()
    slurm.fail_next["expand"] = 1
    run_id = start(store)
    runner(store, slurm).advance(NOW + 1)
    run = run_of(store, run_id)
    assert (run.phase, run.outcome, run.rollback_from) == ("failed", "REQUEUE", "expand")
    assert "Unable to allocate resources" in run.cause or "salloc" in run.cause
    assert slurm.nodes["node5"].reason == "hyperpod:spare"  # back in the pool
    assert live_helpers(slurm) == []
    (requeue,) = [a for a in store.open_actions() if a.kind == "requeue"]
    assert (requeue.job_id, requeue.params["attempt"], requeue.params["cap"]) == (12, 1, 3)
    assert "rolled back" in requeue.cause
    kinds = [e.kind for e in store.events(job_id=12)]
    assert kinds[-2:] == ["step_retry_failed", "step_retry_requeue"]
    # the executor applies the intent as any other: the job requeued once, counted once
    executor = Executor(store, slurm, SparePoolProvider(slurm), config())
    executor.process_open(slurm.nodes, list(slurm.jobs.values()), NOW + 2)
    assert (slurm.jobs[12].state, slurm.jobs[12].restart_count) == ("PENDING", 1)
    tracked = store.job(12)
    assert tracked is not None and tracked.attempts == 1


def test_a_bad_node_taken_by_a_human_is_left_and_the_spare_untouched(store: Store) -> None:
    slurm = fake()
    slurm.nodes["node2"] = replace(slurm.nodes["node2"], flags=frozenset({"DRAIN"}), reason="RMA 7")
    run_id = start(store)
    runner(store, slurm).advance(NOW + 1)
    run = run_of(store, run_id)
    assert (run.outcome, run.rollback_from) == ("REQUEUE", "drain")
    assert "taken since" in run.cause and slurm.nodes["node2"].reason == "RMA 7"
    assert slurm.names("resume") == [] and slurm.nodes["node5"].reason == "hyperpod:spare"


def test_a_merge_that_does_not_take_gives_the_spare_back(store: Store) -> None:
    slurm = fake()
    slurm.fail_next["absorb"] = 1
    run_id = start(store)
    runner(store, slurm).advance(NOW + 1)
    run = run_of(store, run_id)
    assert (run.outcome, run.rollback_from) == ("REQUEUE", "absorb")
    assert live_helpers(slurm) == [] and slurm.nodes["node5"].reason == "hyperpod:spare"
    assert slurm.jobs[12].nodes == ("node1", "node3")


def test_a_job_that_ended_meanwhile_is_not_requeued(store: Store) -> None:
    slurm = fake()
    slurm.jobs[12] = replace(slurm.jobs[12], state="COMPLETED")
    run_id = start(store)
    runner(store, slurm).advance(NOW + 1)
    run = run_of(store, run_id)
    assert (run.outcome, run.rollback_from) == ("REQUEUE", "drain")
    assert [a for a in store.open_actions() if a.kind == "requeue"] == []
    assert "nothing to requeue" in store.events(job_id=12)[-1].message


def test_a_rollback_within_a_spent_budget_requeues_nothing(store: Store) -> None:
    slurm = fake()
    store.upsert_job(TrackedJob(12, 3, attempts=3, updated_at=NOW))
    slurm.fail_next["expand"] = 1
    start(store)
    runner(store, slurm).advance(NOW + 1)
    assert [a for a in store.open_actions() if a.kind == "requeue"] == []
    assert "retry budget spent (3/3)" in store.events(job_id=12)[-1].message


def test_a_rollback_step_that_fails_is_done_again_next_pass(store: Store) -> None:
    slurm = fake()
    slurm.fail_next.update({"expand": 1})
    run_id = start(store)
    r = runner(store, slurm)
    slurm.fail_next["drain"] = 0
    original = slurm.drain

    def drain_spare_fails_once(name: str, reason: str) -> None:
        if name == "node5" and not getattr(drain_spare_fails_once, "done", False):
            drain_spare_fails_once.done = True  # type: ignore[attr-defined]
            slurm.fail_next["drain"] = 1
        original(name, reason)

    slurm.drain = drain_spare_fails_once  # type: ignore[method-assign]
    r.advance(NOW + 1)
    assert run_of(store, run_id).phase == "rollback"
    r.advance(NOW + 2)
    assert run_of(store, run_id).phase == "failed"
    assert len([a for a in store.open_actions() if a.kind == "requeue"]) == 1


def test_helpers_nobody_owns_are_cancelled(store: Store) -> None:
    slurm = fake()
    slurm.jobs[12] = replace(slurm.jobs[12], state="COMPLETED")
    slurm.jobs[40] = Job(
        job_id=40, name="hyperpod-expand-12", state="RUNNING", nodes=("node5",), uid=ME
    )
    slurm.jobs[41] = Job(job_id=41, name="hyperpod-expand-99", state="PENDING", uid=ME)
    slurm.jobs[42] = Job(job_id=42, name="someone-else", state="RUNNING")
    assert runner(store, slurm).orphans.sweep(NOW) == 2
    assert [slurm.jobs[i].state for i in (40, 41, 42)] == ["CANCELLED", "CANCELLED", "RUNNING"]
    assert {e.kind for e in store.events()} == {"step_retry_orphan"}


def test_the_helper_of_a_surgery_under_way_is_kept(store: Store) -> None:
    slurm = fake()
    start(store)
    with pytest.raises(Crash):
        runner(store, slurm, crash_at="absorb").advance(NOW + 1)
    # before the restart, only the sweep runs: the open surgery owns its helper
    store.set_step_phase(1, "expand", NOW + 1)
    assert runner(store, slurm).orphans.sweep(NOW + 2) == 0
    assert slurm.jobs[12].nodes == ("node1", "node3", "node5")


def test_the_same_failed_attempt_records_one_surgery(store: Store) -> None:
    run_id = start(store)
    event = EventIn("step_retry_planned", "again", "node2", 12, "test")
    assert store.add_step_retry(12, "0", 1, 3, PLAN, "test", NOW, event) == (run_id, False)
    assert len(store.events(job_id=12)) == 1


def test_an_expansion_refused_gives_the_reservation_back(store: Store) -> None:
    slurm = fake()
    slurm.fail_next["expand"] = 1
    start(store)
    runner(store, slurm).advance(NOW + 1)
    assert slurm.resv == {} and slurm.nodes["node5"].reason == "hyperpod:spare"


def test_a_reservation_nobody_owns_is_deleted(store: Store) -> None:
    slurm = fake()
    slurm.create_maint_reservation("hyperpod-expand-12", ["node5"], 10, ["root"])
    runner(store, slurm).advance(NOW)
    assert slurm.resv == {}
    assert [e.kind for e in store.events()] == ["step_retry_orphan"]


def test_the_spare_is_asked_for_once_slurm_has_it_responding_again(store: Store) -> None:
    # Slurm flags a node it just resumed NOT_RESPONDING until its next ping; an
    # allocation asked for meanwhile would wait for the periodic scheduler.
    slurm = fake()
    looks: list[bool] = []
    resume, node_of = slurm.resume, slurm.node

    woken: list[str] = []

    def resumed(name: str) -> None:
        resume(name)
        woken.append(name)
        slurm.nodes[name] = replace(slurm.nodes[name], flags=frozenset({"NOT_RESPONDING"}))

    def look(name: str) -> Node:
        n = node_of(name)
        if not woken:  # the gate's own reads before the resume
            return n
        looks.append(n.responding)
        if len(looks) == 3:  # its ping arrives
            slurm.nodes[name] = replace(n, flags=frozenset())
        return n

    slurm.resume, slurm.node = resumed, look  # type: ignore[method-assign]
    start(store)
    runner(store, slurm).advance(NOW + 1)
    assert looks == [False, False, False, True]
    assert slurm.jobs[12].nodes == ("node1", "node3", "node5")


def test_fault_to_ready_is_measured_from_the_faults_first_sighting(store: Store) -> None:
    from hyperpod_agent.controller import metrics
    from hyperpod_agent.controller.store.rows import FaultIn

    def count() -> float:
        return metrics.REGISTRY.get_sample_value("hyperpod_step_retry_fault_seconds_count") or 0

    def total() -> float:
        return metrics.REGISTRY.get_sample_value("hyperpod_step_retry_fault_seconds_sum") or 0

    xid = FaultIn("gpu3", "xid79", "FAIL", "REBOOT", True, "boom")
    store.record_report("node2", "a", 1, NOW - 3, "faulty", "{}", [xid], NOW - 3)
    before, before_sum = count(), total()
    start(store)
    runner(store, fake()).advance(NOW + 1)
    assert count() == before + 1 and total() - before_sum == pytest.approx(4.0)


@pytest.mark.parametrize("after", ["drain", "shrink"])
def test_a_second_node_of_the_job_faulty_before_the_spare_is_in_rolls_back(
    store: Store, after: str
) -> None:
    """Two faults within a second reach the controller a report apart: one retry onto
    a node that is faulty too would fail at once. Seen before the merge, the surgery
    rolls back to one requeue that names both; never a retry, then a requeue."""
    from hyperpod_agent.controller.store.rows import FaultIn

    slurm = fake()
    started = datetime.fromtimestamp(NOW - 600, UTC)
    slurm.jobs[12] = replace(slurm.jobs[12], start_time=started)
    run_id = start(store)
    r = runner(store, slurm, crash_at=after)
    with pytest.raises(Crash):
        r.advance(NOW + 1)
    xid = FaultIn("gpu1", "xid79", "FAIL", "REBOOT", True, "boom")
    store.record_report("node3", "a", 1, NOW + 1, "faulty", "{}", [xid], NOW + 1)
    runner(store, slurm).advance(NOW + 2)
    run = run_of(store, run_id)
    assert (run.phase, run.outcome) == ("failed", "REQUEUE")
    assert "node3" in run.cause and "xid79" in run.cause, run.cause
    assert "absorb" not in [c[0] for c in slurm.calls]  # the spare never joined the job
    assert not slurm.nodes["node5"].drained or slurm.nodes["node5"].reason == "hyperpod:spare"


def test_a_fault_a_kept_node_had_before_its_job_started_is_not_this_steps(store: Store) -> None:
    from hyperpod_agent.controller.store.rows import FaultIn

    slurm = fake()
    slurm.jobs[12] = replace(slurm.jobs[12], start_time=datetime.fromtimestamp(NOW, UTC))
    xid = FaultIn("gpu1", "xid79", "FAIL", "REBOOT", True, "old")
    store.record_report("node3", "a", 1, NOW - 100, "faulty", "{}", [xid], NOW - 100)
    run_id = start(store)
    runner(store, slurm).advance(NOW + 1)
    assert run_of(store, run_id).phase == "done"
