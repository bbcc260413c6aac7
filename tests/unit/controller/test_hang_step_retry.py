"""A hang of a watched ``srun --auto-resume`` step: the pass tells the step to end with
the hang, and the step's failure is retried in place without the suspect node."""

from __future__ import annotations

from dataclasses import replace

from ctl_helpers import NOW, cluster, config, fault, healthy
from test_api import Api
from test_api_steps import FAILURE, WATCH, api, ask, watch  # noqa: F401 - api: fixture
from test_hangs import HUNG, JOB, kinds, rank, training
from test_stepretry_plan import JOB as PLAN_JOB

from hyperpod_agent.controller.hangs.ending import HangEnd
from hyperpod_agent.controller.hangs.judge import Hang, judge
from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.snapshot import Kind, Snapshot
from hyperpod_agent.controller.stepretry.plan import Outcome, StepFailure, decide_step
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.slurm.models import Job
from hyperpod_agent.slurm.models import Node as SlurmNode

TTL = 10.0


# -- the pass -------------------------------------------------------------------------
def test_a_hung_watched_job_gets_its_step_ended_not_a_requeue_nor_a_reboot() -> None:
    snap = replace(training(HUNG), watched_jobs={JOB: None})
    decision = decide(snap, config(), NOW)
    assert kinds(decision) == [("finding", JOB), ("step_end", JOB)]
    end = decision.actions[1]
    hang = HangEnd.from_json(end.params["hang"])
    assert hang is not None and (hang.suspects, hang.shown, hang.clear) == (
        ("node2",),
        ("node2",),
        True,
    )
    assert end.cause.startswith(f"hang: job {JOB} hung")


def test_a_step_already_told_to_end_is_left_to_its_retry() -> None:
    snap = replace(training(HUNG), watched_jobs={JOB: NOW - 2})
    assert decide(snap, config(), NOW).actions == []


def test_observe_mode_only_says_it_would_end_the_step() -> None:
    snap = replace(training(HUNG), watched_jobs={JOB: None})
    decision = decide(snap, config(policy={"mode": "observe"}), NOW)
    assert ("step_end", JOB) in kinds(decision)  # the executor turns it into a would-have


def test_progress_from_before_the_launch_under_watch_is_the_launch_befores() -> None:
    # The step was relaunched 2 s ago after a hang; its new ranks have not recorded
    # yet; the hung launch's records (9 s old) must not make the new launch hung.
    snap = replace(training(HUNG), watched_jobs={JOB: None}, watch_launched={JOB: NOW - 2})
    assert judge(snap, config().progress, NOW)[0] == []
    assert decide(snap, config(), NOW).actions == []
    # the new launch's own records are judged as ever
    fresh = {"node1": [rank(0, at=NOW - 1)], "node3": [rank(1, at=NOW - 1)]}
    assert (
        judge(replace(training(fresh), watch_launched={JOB: NOW - 2}), config().progress, NOW)[0]
        == []
    )


# -- the store ------------------------------------------------------------------------
def test_the_hang_is_kept_with_the_watch_told_once_and_cleared_by_the_next_launch(
    store: Store,
) -> None:
    store.start_watch(12, "s1", 1, ("node1", "node2"), NOW - 3600, NOW, TTL)
    hang = HangEnd("job 12 hung", 100, ("node2",), ("node2",), True)
    event = EventIn("step_end", "told", None, 12, hang.to_json())
    assert store.end_watches_for_hang(12, NOW + 1, event) == 1
    assert store.end_watches_for_hang(12, NOW + 2, event) == 0  # told already
    row = store.step_watch(12, "s1")
    assert row is not None and row.end_at == NOW + 1
    assert HangEnd.latest(store.step_end_causes(12, row.created_at)) == hang
    assert store.watched_jobs(NOW + 2) == {12: NOW + 1}
    assert [e.kind for e in store.events(limit=10)].count("step_end") == 1
    assert store.watch_launches(NOW + 2) == {12: NOW}
    # the relaunch is watched anew: told nothing, and the hang is the launch before's
    store.start_watch(12, "s1", 2, ("node1", "node5"), NOW - 3600, NOW + 30, TTL)
    row = store.step_watch(12, "s1")
    assert row is not None and row.end_at is None
    assert HangEnd.latest(store.step_end_causes(12, row.created_at)) is None
    assert store.watch_launches(NOW + 31) == {12: NOW + 30}
    # an expired watch is not told
    assert store.end_watches_for_hang(12, NOW + 30 + TTL + 1, event) == 0


def test_the_record_fits_an_events_cause_and_a_faults_cause_is_no_hang() -> None:
    many = tuple(f"node-{'x' * 60}-{i}" for i in range(40))
    hang = Hang(12, 0, 7, 60.0, 5.0, 0.5, many, "y" * 2000, False, shown=many[:2])
    record = HangEnd.of(hang)
    text = record.to_json()
    assert len(text) <= 480, len(text)
    back = HangEnd.from_json(text)
    assert back is not None and back.suspects == many[:3] and back.shown == many[:2]
    assert len(back.suspects) > 1  # still "several": the retry falls back to a requeue
    assert HangEnd.latest(["gpu3 xid79 on node2", text, "slurmd slurmd_down on node3"]) == back
    assert HangEnd.latest(["gpu3 xid79 on node2"]) is None


def test_a_record_this_version_cannot_read_is_no_hang() -> None:
    for text in ("", "{", "[]", '{"cause": "x"}', '{"cause":1,"step":"a","suspects":[],'):
        assert HangEnd.from_json(text) is None, text


# -- the step's retry -----------------------------------------------------------------
SPARE5 = replace(cluster(8)["node5"], flags=frozenset({"DRAIN"}), reason="hyperpod:spare")
STEP_JOB = replace(PLAN_JOB, batch_host="node1")


def retry(
    hang: HangEnd,
    job: Job = STEP_JOB,
    faults: tuple[object, ...] = (),
    nodes: dict[str, SlurmNode] | None = None,
) -> tuple[Outcome, str, str, str]:
    all_nodes = cluster(8)
    all_nodes["node5"] = SPARE5
    all_nodes.update(nodes or {})
    snap = Snapshot(
        nodes=all_nodes,
        jobs=[job],
        health={n: healthy() for n in all_nodes},
        open_faults=list(faults),  # type: ignore[arg-type]
        history=list(faults),  # type: ignore[arg-type]
        started_at=NOW - 3600,
    )
    failure = StepFailure(12, "s1", 143, job.nodes, 1, hang=hang)
    plan = decide_step(job, failure, snap, config(), NOW)
    return plan.outcome, plan.cause, plan.bad_node, plan.reason


def hang(suspects: tuple[str, ...], shown: tuple[str, ...] = (), clear: bool = True) -> HangEnd:
    return HangEnd("job 12 hung: ...", 100, suspects, shown, clear)


def test_a_stopped_rank_is_the_bad_node_replaced_by_a_spare() -> None:
    outcome, cause, bad, reason = retry(hang(("node2",), ("node2",)))
    assert (outcome, bad) == (Outcome.RETRYSTEP, "node2")
    assert cause.startswith("hang: job 12 hung") and "node5 stands in" in cause
    assert reason == "hyperpod:replace job12 hang hung at step 100"


def test_a_suspect_named_only_by_the_records_goes_to_a_deep_check() -> None:
    outcome, _, bad, reason = retry(hang(("node3",)))
    assert (outcome, bad) == (Outcome.RETRYSTEP, "node3")
    assert reason == "hyperpod:check job12 hang hung at step 100"


def test_the_stopped_batch_host_stays_in_the_job_only_as_that() -> None:
    outcome, cause, bad, _ = retry(hang(("node1",), ("node1",)))
    assert (outcome, bad) == (Outcome.RETRYSTEP, "node1")
    assert "node1 stays as the batch host only" in cause


def test_an_unclear_suspect_on_the_batch_host_is_a_requeue() -> None:
    outcome, cause, _, _ = retry(hang(("node1",)))
    assert outcome is Outcome.REQUEUE and "unclear suspect is the batch host" in cause


def test_no_suspect_or_every_node_suspect_is_a_requeue_with_the_hang() -> None:
    outcome, cause, _, _ = retry(hang(()))
    assert outcome is Outcome.REQUEUE and "no suspect among the step's nodes" in cause
    assert cause.startswith("hang: job 12 hung")
    outcome, cause, _, _ = retry(hang(("node2", "node3"), ("node2", "node3"), clear=False))
    assert outcome is Outcome.REQUEUE and "replaces one node" in cause


def test_a_node_fault_says_more_than_the_hang() -> None:
    xid = fault("node3", component="gpu3", code="xid79", action="REBOOT", urgent=True)
    outcome, cause, bad, reason = retry(hang(("node2",), ("node2",)), faults=(xid,))
    assert (outcome, bad) == (Outcome.RETRYSTEP, "node3")
    assert reason.startswith("hyperpod:replace gpu3 xid79")


def test_a_hang_of_a_job_that_did_not_opt_in_fails_as_ever() -> None:
    outcome, cause, _, _ = retry(
        hang(("node2",), ("node2",)), job=replace(STEP_JOB, auto_resume=None)
    )
    assert outcome is Outcome.FAIL and "did not opt in" in cause


def test_the_kind_is_bookkeeping() -> None:
    assert Kind.STEP_END.value == "step_end"


# -- through the API: the watch's answer and the retry ------------------------------
def test_a_watched_step_the_pass_ended_for_a_hang_is_retried_without_its_suspect(
    api: Api,  # noqa: F811 - the fixture imported above
) -> None:
    api.controller.reconcile_once()
    assert watch(api).json()["end"] is False
    # the pass's step_end (what records.step_end writes): node2's rank is stopped
    now = api.controller.clock()
    ended = HangEnd("job 12 hung: no rank advanced", 40, ("node2",), ("node2",), True)
    event = EventIn("step_end", "told", None, 12, ended.to_json())
    assert api.store.end_watches_for_hang(12, now, event) == 1
    out = watch(api).json()
    assert out["end"] is True and out["cause"] == "hang: job 12 hung: no rank advanced"
    # the pass leaves the told job to the step retry: no requeue, no reboot of node2
    api.controller.reconcile_once()
    assert [c for c in api.slurm.calls if c[0] in ("requeue", "reboot", "drain")] == []
    # srun ended by the helper (SIGTERM): the failure is the hang's suspect's
    resp = ask(api, {**FAILURE, "step_id": WATCH["step_id"], "exit_code": 143})
    assert resp.status_code == 202, resp.text
    first = resp.json()
    assert first["decision"] == "RETRYSTEP" and first["cause"].startswith("hang: job 12 hung")
    api.controller.reconcile_once()  # the surgery
    done = api.get(f"/v1/steps/retry/{first['id']}", who="node1").json()
    assert (done["phase"], done["nodelist"]) == ("done", "node[1,3,5]")
    assert api.slurm.nodes["node2"].reason == "hyperpod:replace job12 hang hung at step 40"
