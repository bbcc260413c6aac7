"""What a job's own records may change about its hang judgement, and what they may not:
its overrides only loosen the site's settings, a paused phase has a site maximum, and
no node is taken out on what only the records say (DESIGN §12)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from ctl_helpers import NOW, config, fault, healthy, job, node, ts
from pydantic import ValidationError

from hyperpod_agent.controller.config import ProgressConfig
from hyperpod_agent.controller.hangs.judge import judge
from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.snapshot import Decision, NodeHealth, Snapshot
from hyperpod_agent.health import JobProgress, RankProgress
from hyperpod_agent.slurm.models import Job

JOB = 42
START = NOW - 3 * 3600
TINY = 1e-300


def rank(
    r: int,
    step: int = 100,
    at: float = NOW - 1,
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
        window=64,
        median_s=0.45,
        p95_s=0.5,
        last_s=0.45,
        proc_state=state,
    )


def training(
    ranks: dict[str, list[RankProgress]],
    overrides: dict[str, dict[str, Any]] | None = None,
    auto_resume: int | None = 3,
    faults: tuple[object, ...] = (),
) -> Snapshot:
    """Job 42 on the nodes named, each reporting its ranks with its own overrides."""
    nodes = {f"node{i}": node(f"node{i}") for i in range(1, 9)}
    health = {n: healthy() for n in nodes}
    for name, rs in ranks.items():
        jp = JobProgress(job_id=JOB, ranks=rs, **(overrides or {}).get(name, {}))
        health[name] = NodeHealth(healthy().verdict, NOW, NOW, progress=(jp,))  # as of now
    j: Job = replace(job(JOB, nodes=tuple(ranks), auto_resume=auto_resume), start_time=ts(START))
    return Snapshot(
        nodes=nodes,
        jobs=[j],
        health=health,
        open_faults=list(faults),  # type: ignore[arg-type]
        history=list(faults),  # type: ignore[arg-type]
        started_at=NOW - 3600,
    )


def kinds(decision: Decision) -> list[tuple[str, object]]:
    return [(a.kind.value, a.node if a.node else a.job_id) for a in decision.actions]


# -- overrides: never below the site's ----------------------------------------------------


def test_overrides_below_the_sites_settings_are_raised_to_them() -> None:
    # The forged record's settings: a hang the moment no step comes. p95 0.5 s: the
    # site's limit is max(3 x 0.5, 5) = 5 s; 4 s without a step is no hang.
    idle = {"node1": [rank(0, at=NOW - 4)], "node2": [rank(1, at=NOW - 4)]}
    tiny = {n: {"hang_factor": TINY, "hang_min_s": TINY} for n in idle}
    assert judge(training(idle, tiny), config().progress, NOW)[0] == []
    late = {"node1": [rank(0, at=NOW - 6)], "node2": [rank(1, at=NOW - 6)]}
    [hang], _ = judge(training(late, tiny), config().progress, NOW)
    assert hang.threshold_s == 5.0


def test_a_factor_below_the_sites_is_raised_to_it() -> None:
    # 10 s steps: the site's 3 x 10 = 30 s, whatever factor the records ask for.
    slow = {"node1": [rank(0, at=NOW - 20)], "node2": [rank(1, at=NOW - 20)]}
    slow = {n: [r.model_copy(update={"p95_s": 10.0})] for n, [r] in slow.items()}
    tiny = {n: {"hang_factor": 0.5} for n in slow}
    assert judge(training(slow, tiny), config().progress, NOW)[0] == []


def test_overrides_above_the_sites_settings_loosen_them() -> None:
    ranks = {"node1": [rank(0, at=NOW - 30)], "node2": [rank(1, at=NOW - 30)]}
    loose = {n: {"hang_min_s": 60.0} for n in ranks}
    assert judge(training(ranks, loose), config().progress, NOW)[0] == []
    factor = {n: {"hang_factor": 100.0} for n in ranks}  # 100 x 0.5 = 50 s
    assert judge(training(ranks, factor), config().progress, NOW)[0] == []


def test_the_jobs_setting_is_the_largest_any_node_reports_not_the_smallest() -> None:
    # One node's records ask for a tiny floor, the other's for 60 s: the job is given
    # 60 s (the old rule took the smallest from any node: hung after 5 s).
    ranks = {"node1": [rank(0, at=NOW - 30)], "node2": [rank(1, at=NOW - 30)]}
    mixed = {"node1": {"hang_min_s": TINY}, "node2": {"hang_min_s": 60.0}}
    assert judge(training(ranks, mixed), config().progress, NOW)[0] == []
    [hang], _ = judge(
        training(
            {n: [r.model_copy(update={"step_at": NOW - 61})] for n, [r] in ranks.items()}, mixed
        ),
        config().progress,
        NOW,
    )
    assert hang.threshold_s == 60.0


def test_a_forged_instant_hang_requeues_nothing() -> None:
    # Through decide: the records of the old attack, with the job stepping 1 s ago.
    ranks = {"node1": [rank(0, at=NOW - 1)], "node2": [rank(1, at=NOW - 1, state="gone")]}
    tiny = {n: {"hang_factor": TINY, "hang_min_s": TINY} for n in ranks}
    assert decide(training(ranks, tiny), config(), NOW).actions == []


# -- a paused phase has a site maximum ---------------------------------------------------


def test_max_pause_s_defaults_to_an_hour_and_is_validated() -> None:
    assert ProgressConfig().max_pause_s == 3600.0
    assert config(progress={"max_pause_s": 600}).progress.max_pause_s == 600.0
    for bad in (0, -1, 8 * 86400, "long"):
        with pytest.raises(ValidationError, match="max_pause_s"):
            ProgressConfig.model_validate({"max_pause_s": bad})


def paused_for(seconds: float) -> dict[str, list[RankProgress]]:
    since = NOW - seconds
    return {
        "node1": [rank(0, at=since - 1, paused=True, pause_since=since)],
        "node2": [rank(1, at=since - 1, paused=True, pause_since=since)],
    }


def test_a_paused_phase_within_max_pause_s_is_not_judged() -> None:
    assert judge(training(paused_for(3599)), config().progress, NOW)[0] == []


def test_a_paused_phase_past_max_pause_s_is_judged_again() -> None:
    [hang], _ = judge(training(paused_for(3601)), config().progress, NOW)
    assert 3600 < hang.idle_s < 3603
    assert "paused for 3601 s (over max_pause_s)" in hang.describe()
    short = config(progress={"max_pause_s": 60}).progress
    assert judge(training(paused_for(61)), short, NOW)[0]
    assert judge(training(paused_for(59)), short, NOW)[0] == []


def test_one_rank_paused_past_the_maximum_hides_nothing() -> None:
    # A rank "paused" for hours beside ranks that stopped stepping.
    ranks = {
        "node1": [rank(0, at=NOW - 5000, paused=True, pause_since=NOW - 4000)],
        "node2": [rank(1, at=NOW - 30)],
    }
    assert judge(training(ranks), config().progress, NOW)[0]


def test_a_paused_job_past_the_maximum_is_recovered_like_any_hang() -> None:
    decision = decide(training(paused_for(7200)), config(), NOW)
    assert kinds(decision) == [("finding", JOB), ("requeue", JOB)]


# -- what may take a node out ------------------------------------------------------------

HUNG_T = {"node1": [rank(0, at=NOW - 9)], "node2": [rank(1, at=NOW - 9, state="T")]}
# What only the records say: node2's rank is behind (a step number its user wrote).
HUNG_BEHIND = {"node1": [rank(0, at=NOW - 9)], "node2": [rank(1, step=5, at=NOW - 9)]}


def test_a_suspect_only_its_records_name_is_named_and_not_taken_out() -> None:
    [hang], _ = judge(training(HUNG_BEHIND), config().progress, NOW)
    assert hang.suspects == ("node2",) and hang.clear and hang.shown == ()
    assert "rank 1 at step 5 < 100" in hang.describe()
    assert kinds(decide(training(HUNG_BEHIND), config(), NOW)) == [
        ("finding", JOB),
        ("requeue", JOB),
    ]


@pytest.mark.parametrize("state", ["T", "D", "Z", "gone"])
def test_a_process_state_the_agent_read_takes_the_suspect_out(state: str) -> None:
    ranks = {"node1": [rank(0, at=NOW - 9)], "node2": [rank(1, at=NOW - 9, state=state)]}
    [hang], _ = judge(training(ranks), config().progress, NOW)
    assert hang.shown == ("node2",)
    assert kinds(decide(training(ranks), config(), NOW)) == [
        ("finding", JOB),
        ("reboot", "node2"),
        ("requeue", JOB),
    ]


def test_an_open_fault_is_evidence_the_node_shows() -> None:
    f = fault("node1", component="gpu2", code="xid79", action="REBOOT")
    ranks = {n: [rank(i, at=NOW - 9)] for i, n in enumerate(("node1", "node2", "node3"))}
    [hang], _ = judge(training(ranks, faults=(f,)), config().progress, NOW)
    assert hang.suspects == ("node1",) and hang.shown == ("node1",) and hang.clear


def test_a_behind_node_beside_a_stopped_one_is_not_taken_out() -> None:
    ranks = {
        "node1": [rank(0, at=NOW - 9)],
        "node2": [rank(1, at=NOW - 9, state="T")],
        "node3": [rank(2, step=7, at=NOW - 9)],
    }
    roomy = config(policy={"max_unhealthy_fraction": 0.5})  # room for both
    found = kinds(decide(training(ranks), roomy, NOW))
    assert ("reboot", "node2") in found and ("reboot", "node3") not in found
