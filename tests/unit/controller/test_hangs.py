"""Hangs and stragglers from progress reports, through ``decide`` (DESIGN §12)."""

from __future__ import annotations

from dataclasses import replace

from ctl_helpers import NOW, config, fault, healthy, job, node, ts

from hyperpod_agent.controller.hangs.judge import judge
from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.snapshot import Decision, Kind, NodeHealth, Snapshot
from hyperpod_agent.controller.store.rows import FindingRow
from hyperpod_agent.health import JobProgress, RankProgress
from hyperpod_agent.slurm.models import Job

JOB = 42
START = NOW - 600


def rank(
    r: int,
    step: int = 100,
    at: float = NOW - 1,
    p95: float = 0.5,
    median: float = 0.45,
    window: int = 64,
    state: str = "S",
    paused: bool = False,
    pause_since: float | None = None,
) -> RankProgress:
    return RankProgress(
        rank=r,
        pid=1000 + r,
        step=step,
        step_at=at,
        paused=paused,
        pause_since=pause_since,
        window=window,
        median_s=median,
        p95_s=p95,
        last_s=median,
        proc_state=state,
    )


def training(
    ranks: dict[str, list[RankProgress]],
    auto_resume: int | None = 3,
    findings: tuple[FindingRow, ...] = (),
    job_id: int = JOB,
    faults: tuple[object, ...] = (),
    **jp: float,
) -> Snapshot:
    nodes = {f"node{i}": node(f"node{i}") for i in range(1, 7)}
    health = {n: healthy() for n in nodes}
    for name, rs in ranks.items():
        # Generated (node clock) and heard (controller clock) now: the idle times
        # below are what the ranks' own records say as of now.
        health[name] = NodeHealth(
            healthy().verdict,
            NOW,
            NOW,
            progress=(JobProgress(job_id=job_id, ranks=rs, **jp),),  # type: ignore[arg-type]
        )
    j: Job = replace(job(job_id, nodes=tuple(ranks), auto_resume=auto_resume), start_time=ts(START))
    return Snapshot(
        nodes=nodes,
        jobs=[j],
        health=health,
        open_faults=list(faults),  # type: ignore[arg-type]
        history=list(faults),  # type: ignore[arg-type]
        started_at=NOW - 3600,
        findings=findings,
    )


def kinds(decision: Decision) -> list[tuple[str, object]]:
    return [(a.kind.value, a.node if a.node else a.job_id) for a in decision.actions]


# -- hang ---------------------------------------------------------------------------
def test_a_job_that_advances_is_not_hung() -> None:
    snap = training({"node1": [rank(0)], "node2": [rank(1)]})
    assert judge(snap, config().progress, NOW) == ([], [])


def test_no_rank_advancing_past_the_limit_is_a_hang_with_the_stopped_rank_named() -> None:
    # p95 0.5 s: limit max(3 x 0.5, 5) = 5 s; nothing for 8 s; node2's rank is stopped.
    snap = training({"node1": [rank(0, at=NOW - 8)], "node2": [rank(1, at=NOW - 8, state="T")]})
    [hang], _ = judge(snap, config().progress, NOW)
    assert (hang.job_id, hang.step, hang.suspects, hang.clear) == (JOB, 100, ("node2",), True)
    assert hang.threshold_s == 5.0 and 7.9 < hang.idle_s < 8.1
    assert "node2: rank 1 state T" in hang.describe()


def test_just_under_the_limit_is_not_a_hang() -> None:
    snap = training({"node1": [rank(0, at=NOW - 4.9)], "node2": [rank(1, at=NOW - 4.9)]})
    assert judge(snap, config().progress, NOW)[0] == []


def test_the_limit_follows_the_jobs_own_step_time() -> None:
    # 10 s steps: 3 x 10 = 30 s; 20 s without a step is a slow step, not a hang.
    slow = {"node1": [rank(0, at=NOW - 20, p95=10)], "node2": [rank(1, at=NOW - 20, p95=10)]}
    assert judge(training(slow), config().progress, NOW)[0] == []
    late = {"node1": [rank(0, at=NOW - 31, p95=10)], "node2": [rank(1, at=NOW - 31, p95=10)]}
    assert len(judge(training(late), config().progress, NOW)[0]) == 1


def test_a_paused_phase_is_never_a_hang() -> None:
    snap = training(
        {
            "node1": [rank(0, at=NOW - 180, paused=True, pause_since=NOW - 179)],
            "node2": [rank(1, at=NOW - 180, paused=True, pause_since=NOW - 179)],
        }
    )
    assert judge(snap, config().progress, NOW)[0] == []


def test_the_end_of_a_pause_restarts_the_clock() -> None:
    # Checkpoint load for 3 minutes, ended 2 s ago: the first step is not due yet.
    ranks = {
        "node1": [rank(0, at=NOW - 200, pause_since=NOW - 2)],
        "node2": [rank(1, at=NOW - 200, pause_since=NOW - 2)],
    }
    assert judge(training(ranks), config().progress, NOW)[0] == []


def test_no_judgement_before_the_job_has_a_pace() -> None:
    ranks = {"node1": [rank(0, at=NOW - 60, window=3)], "node2": [rank(1, at=NOW - 60, window=3)]}
    assert judge(training(ranks), config().progress, NOW)[0] == []


def test_ranks_of_an_earlier_run_are_ignored() -> None:
    # Requeued: the records on the nodes are from before the job's new start.
    ranks = {"node1": [rank(0, at=START - 30)], "node2": [rank(1, at=START - 30, state="gone")]}
    assert judge(training(ranks), config().progress, NOW)[0] == []


def test_progress_from_a_node_the_job_does_not_run_on_is_ignored() -> None:
    snap = training({"node1": [rank(0)], "node2": [rank(1)]})
    stale = NodeHealth(
        healthy().verdict,
        NOW - 1,
        NOW - 1,
        progress=(JobProgress(job_id=JOB, ranks=[rank(5, at=NOW - 900, state="T")]),),
    )
    snap = replace(snap, health={**snap.health, "node5": stale})
    assert judge(snap, config().progress, NOW)[0] == []


def test_a_rank_behind_the_others_is_the_suspect() -> None:
    ranks = {"node1": [rank(0, step=100, at=NOW - 9)], "node2": [rank(1, step=99, at=NOW - 9.4)]}
    [hang], _ = judge(training(ranks), config().progress, NOW)
    assert hang.suspects == ("node2",) and hang.clear
    assert "rank 1 at step 99 < 100" in hang.evidence


def test_a_node_with_an_open_fault_is_a_suspect() -> None:
    f = fault("node1", component="gpu2", code="xid79", action="REBOOT")
    ranks = {"node1": [rank(0, at=NOW - 9)], "node2": [rank(1, at=NOW - 9)]}
    [hang], _ = judge(training(ranks, faults=(f,)), config().progress, NOW)
    assert hang.suspects == ("node1",) and "open fault gpu2 xid79" in hang.evidence


def test_every_node_suspect_is_no_clear_attribution() -> None:
    ranks = {"node1": [rank(0, at=NOW - 9, state="D")], "node2": [rank(1, at=NOW - 9, state="D")]}
    [hang], _ = judge(training(ranks), config().progress, NOW)
    assert hang.suspects == ("node1", "node2") and not hang.clear


def test_per_job_override_from_the_ranks() -> None:
    ranks = {"node1": [rank(0, at=NOW - 30)], "node2": [rank(1, at=NOW - 30)]}
    assert judge(training(ranks, hang_min_s=60.0), config().progress, NOW)[0] == []
    [hang], _ = judge(training(ranks, hang_min_s=20.0), config().progress, NOW)
    assert hang.threshold_s == 20.0


def test_switched_off() -> None:
    ranks = {"node1": [rank(0, at=NOW - 60)], "node2": [rank(1, at=NOW - 60)]}
    assert judge(training(ranks), config(progress={"enabled": False}).progress, NOW) == ([], [])


# -- what decide does about a hang ----------------------------------------------------
HUNG = {"node1": [rank(0, at=NOW - 9)], "node2": [rank(1, at=NOW - 9, state="T")]}


def test_a_hung_auto_resume_job_is_declared_requeued_and_its_suspect_rebooted() -> None:
    decision = decide(training(HUNG), config(), NOW)
    assert kinds(decision) == [("finding", JOB), ("reboot", "node2"), ("requeue", JOB)]
    reboot = decision.actions[1]
    assert reboot.reason.startswith(f"hyperpod:reboot job{JOB} hang ")
    assert decision.actions[2].cause.startswith(f"hang: job {JOB} hung")
    assert decision.hung_jobs == 1


def test_a_declared_hang_is_not_declared_again_but_still_recovered() -> None:
    declared = FindingRow(1, "hang", JOB, 0, "", 100, "x", NOW - 5)
    decision = decide(training(HUNG, findings=(declared,)), config(), NOW)
    assert [k for k, _ in kinds(decision)] == ["reboot", "requeue"]


def test_the_suspect_action_is_configurable() -> None:
    drained = decide(training(HUNG), config(progress={"suspect_action": "drain"}), NOW)
    assert kinds(drained) == [("finding", JOB), ("drain", "node2"), ("requeue", JOB)]
    assert drained.actions[1].reason.startswith(f"hyperpod:drain job{JOB} hang ")
    left = decide(training(HUNG), config(progress={"suspect_action": "none"}), NOW)
    assert kinds(left) == [("finding", JOB), ("requeue", JOB)]


def test_without_clear_attribution_the_job_restarts_and_no_node_is_touched() -> None:
    ranks = {"node1": [rank(0, at=NOW - 9)], "node2": [rank(1, at=NOW - 9)]}
    assert kinds(decide(training(ranks), config(), NOW)) == [("finding", JOB), ("requeue", JOB)]


def test_a_suspect_someone_else_drained_is_not_touched() -> None:
    snap = training(HUNG)
    human = node("node2", flags=("DRAIN",), reason="bad fan")
    snap = replace(snap, nodes={**snap.nodes, "node2": human})
    assert [k for k, _ in kinds(decide(snap, config(), NOW))] == ["finding", "requeue"]


def test_a_hung_job_that_is_not_auto_resume_gets_the_event_only() -> None:
    snap = training(HUNG, auto_resume=None)
    assert kinds(decide(snap, config(), NOW)) == [("finding", JOB)]
    cancel = decide(snap, config(progress={"cancel_unmanaged": True}), NOW)
    assert kinds(cancel) == [("finding", JOB), ("cancel", JOB)]


def test_a_suspect_take_out_obeys_the_blast_radius() -> None:
    # A partition of 6 at the default 10 %: one node may be out; one already is.
    snap = training(HUNG)
    snap = replace(snap, nodes={**snap.nodes, "node6": node("node6", flags=("DRAIN",), reason="x")})
    decision = decide(snap, config(), NOW)
    assert ("reboot", "node2") not in kinds(decision)
    assert decision.incident


# -- stragglers -----------------------------------------------------------------------
def test_a_node_40_percent_slower_is_a_straggler() -> None:
    ranks = {
        "node1": [rank(0, median=1.0)],
        "node2": [rank(1, median=1.4)],
        "node3": [rank(2, median=1.02)],
    }
    _, [slow] = judge(training(ranks), config().progress, NOW)
    assert (slow.node, round(slow.ratio, 2)) == ("node2", 0.39)
    assert "node2 straggles in job 42" in slow.describe()
    decision = decide(training(ranks), config(), NOW)
    assert kinds(decision) == [("finding", "node2")]


def test_two_nodes_one_slower_is_named() -> None:
    ranks = {"node1": [rank(0, median=1.0)], "node2": [rank(1, median=1.4)]}
    _, stragglers = judge(training(ranks), config().progress, NOW)
    assert [s.node for s in stragglers] == ["node2"]


def test_a_uniform_job_has_no_straggler() -> None:
    ranks = {f"node{i}": [rank(i, median=1.0 + 0.01 * i)] for i in range(1, 5)}
    assert judge(training(ranks), config().progress, NOW)[1] == []


def test_too_few_steps_to_call_a_straggler() -> None:
    ranks = {"node1": [rank(0, median=1.0, window=10)], "node2": [rank(1, median=2, window=10)]}
    assert judge(training(ranks), config().progress, NOW)[1] == []


def test_a_straggler_is_declared_once_and_counts_toward_the_lemon_score() -> None:
    ranks = {"node1": [rank(0, median=1.0)], "node2": [rank(1, median=1.4)]}
    declared = FindingRow(1, "straggler", JOB, 0, "node2", -1, "x", NOW - 5)
    assert judge(training(ranks, findings=(declared,)), config().progress, NOW)[1] == []
    # Four faults plus the straggler reach a lemon threshold of 5: the node is held.
    faults = tuple(
        fault("node2", component=f"gpu{i}", code="xid48", first_seen=NOW - 100 * (i + 1))
        for i in range(4)
    )
    snap = training(ranks, findings=(declared,), faults=faults)
    assert any(
        a.kind is Kind.HOLD and a.node == "node2" for a in decide(snap, config(), NOW).actions
    )


def test_a_step_time_that_grows_slowly_is_never_a_hang() -> None:
    # Warm-up the other way round: every step 3 % longer than the last, for 300 steps.
    # Just before each step ends, the agent's summary covers the last 128 steps.
    durations = [0.2 * 1.03**i for i in range(300)]
    for i in range(20, 300):
        window = sorted(durations[max(0, i - 128) : i])
        p95 = window[min(len(window) - 1, int(0.95 * len(window)))]
        median = window[len(window) // 2]
        idle = durations[i] * 0.999  # the next step is about to finish
        ranks = {
            "node1": [rank(0, at=NOW - idle, p95=p95, median=median, window=len(window))],
            "node2": [rank(1, at=NOW - idle, p95=p95, median=median, window=len(window))],
        }
        assert judge(training(ranks), config().progress, NOW)[0] == [], i


def test_a_requeued_job_starting_again_is_not_judged_on_the_last_runs_records() -> None:
    # Running again for 3 s, its new ranks not yet recording; the records of the run
    # before (its frozen rank now gone) are 13 s old, past the 5 s limit.
    ranks = {"node1": [rank(0, at=NOW - 13)], "node2": [rank(1, at=NOW - 13.5, state="gone")]}
    snap = training(ranks)
    restarted = replace(snap.jobs[0], start_time=ts(NOW - 3), restart_count=1)
    snap = replace(snap, jobs=[restarted])
    assert decide(snap, config(), NOW).actions == []


# -- holding a straggler once its job ended -------------------------------------------
def straggled(job_state: str = "COMPLETED", **progress: object) -> Snapshot:
    finding = FindingRow(1, "straggler", JOB, 0, "node2", -1, "node2 straggles", NOW - 60)
    snap = training({"node1": [rank(0)], "node2": [rank(1)]}, findings=(finding,))
    ended = replace(snap.jobs[0], state=job_state)
    return replace(snap, jobs=[ended])


def held(snap: Snapshot, **progress: object) -> list[tuple[str, object]]:
    return kinds(decide(snap, config(progress=progress), NOW))


def test_a_straggler_is_held_once_its_job_ended_when_configured() -> None:
    assert held(straggled()) == []  # off by default
    [(kind, name)] = held(straggled(), straggler_hold_after_job=True)
    assert (kind, name) == ("hold", "node2")
    [action] = decide(straggled(), config(progress={"straggler_hold_after_job": True}), NOW).actions
    assert action.reason.startswith(f"hyperpod:hold job{JOB} straggler ")


def test_a_straggler_is_never_held_mid_job() -> None:
    assert held(straggled("RUNNING"), straggler_hold_after_job=True) == []


def test_a_straggler_held_and_resumed_by_an_admin_is_not_held_again() -> None:
    from ctl_helpers import action_row

    snap = straggled()
    done = action_row("hold", "node2", updated_at=NOW - 30)
    assert held(replace(snap, done=[done]), straggler_hold_after_job=True) == []


def test_a_straggler_someone_else_drained_is_left_alone() -> None:
    snap = straggled()
    snap = replace(
        snap, nodes={**snap.nodes, "node2": node("node2", flags=("DRAIN",), reason="bad dimm")}
    )
    assert held(snap, straggler_hold_after_job=True) == []


def test_a_step_being_retried_in_place_is_not_a_hang() -> None:
    # The step was told to end (a node fault) and its retry is under way: no rank
    # advances meanwhile, by design. A watched step still running is judged as ever.
    stalled = training({"node1": [rank(0, at=NOW - 8)], "node2": [rank(1, at=NOW - 8)]})
    assert judge(replace(stalled, watched_jobs={JOB: None}), config().progress, NOW)[0]
    ending = replace(stalled, watched_jobs={JOB: NOW - 6})
    assert judge(ending, config().progress, NOW) == ([], [])
    in_surgery = replace(stalled, step_retries={JOB: ("node2", "node5")})
    assert judge(in_surgery, config().progress, NOW) == ([], [])
