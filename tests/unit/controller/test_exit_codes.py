"""The application's own word on a restart, as NVIDIA resiliency-ext's in-job restart
spells it: exit 93 is "do not restart", 130 a clean stop (SIGINT). A step or a job that
ends with either is neither retried in place nor requeued, even when one of its nodes
has a fault that would otherwise have made it the node's failure."""

from __future__ import annotations

from dataclasses import replace

import pytest
from ctl_helpers import NOW, cluster, config, faulty, healthy, job
from test_stepretry_plan import JOB, SPARE5, XID79

from hyperpod_agent.controller.autoresume import NO_RESTART_EXITS, no_restart, plan
from hyperpod_agent.controller.snapshot import Snapshot
from hyperpod_agent.controller.stepretry.plan import Outcome, StepFailure, decide_step
from hyperpod_agent.slurm.models import Job

RUNNING = JOB  # three nodes, opted in, in partition main; node2 has XID79


def step_snapshot() -> Snapshot:
    """A step's node2 has an urgent fault and a spare is ready: the conditions of a
    retry in place, were the exit code a node's."""
    nodes = cluster(8)
    nodes["node5"] = SPARE5
    health = {n: healthy() for n in nodes}
    health["node2"] = faulty()
    return Snapshot(
        nodes=nodes,
        jobs=[RUNNING],
        health=health,
        open_faults=[XID79],
        history=[XID79],
        started_at=NOW - 3600,
    )


def decide(code: int) -> tuple[Outcome, str]:
    failure = StepFailure(12, "0", code, ("node1", "node2", "node3"), 1)
    answer = decide_step(RUNNING, failure, step_snapshot(), config(), NOW)
    return answer.outcome, answer.cause


def test_the_two_codes_are_the_resiliency_conventions() -> None:
    assert set(NO_RESTART_EXITS) == {93, 130}


@pytest.mark.parametrize(
    ("code", "says"),
    [(93, "exit 93: the application asked not to restart"), (130, "exit 130: a clean stop")],
)
def test_a_step_ending_93_or_130_is_not_retried_despite_a_node_fault(code: int, says: str) -> None:
    outcome, cause = decide(code)
    assert outcome is Outcome.FAIL
    assert says in cause


@pytest.mark.parametrize("code", [1, 137, 143, 233])
def test_other_codes_on_a_faulty_node_are_still_retried_in_place(code: int) -> None:
    # 143: what a step the controller ends (SIGTERM through the helper) exits with
    outcome, cause = decide(code)
    assert outcome is Outcome.RETRYSTEP, cause


def run_jobs(jobs: list[Job], cfg: dict[str, object] | None = None) -> list[tuple[str, int]]:
    """The auto-resume plan for ended jobs on node2, which has an open urgent fault."""
    nodes = cluster(4)
    snap = Snapshot(
        nodes=nodes,
        jobs=jobs,
        health={n: healthy() for n in nodes},
        open_faults=[XID79],
        history=[XID79],
    )
    actions, _ = plan(snap, config(auto_resume=cfg or {}), NOW, set(), {"node2": [XID79]})
    return [(a.kind.value, int(a.job_id or 0)) for a in actions]


@pytest.mark.parametrize("code", [93, 130])
@pytest.mark.parametrize("retry_on", ["node_fault", "any_failure"])
def test_a_job_ending_93_or_130_is_not_requeued_despite_a_node_fault(
    code: int, retry_on: str
) -> None:
    failed = job(7, state="FAILED", nodes=("node2",), exit_code=code)
    nodes = cluster(4)
    snap = Snapshot(
        nodes=nodes,
        jobs=[failed],
        health={n: healthy() for n in nodes},
        open_faults=[XID79],
        history=[XID79],
    )
    actions, _ = plan(snap, config(auto_resume={"retry_on": retry_on}), NOW, set(), {})
    assert [(a.kind.value, a.job_id) for a in actions] == [("not_retried", 7)]
    assert f"exit {code}" in actions[0].cause and "not requeued" in actions[0].cause


def test_a_job_killed_by_sigint_counts_as_130() -> None:
    # Slurm shows a batch script killed by a signal as exit 0 with the signal apart
    interrupted = replace(
        job(7, state="FAILED", nodes=("node2",), exit_code=0), extra={"exit_signal": "2"}
    )
    assert no_restart(interrupted) == 130
    assert run_jobs([interrupted]) == [("not_retried", 7)]


@pytest.mark.parametrize("code", [1, 233])
def test_other_codes_on_a_faulty_node_are_still_requeued(code: int) -> None:
    assert run_jobs([job(7, state="FAILED", nodes=("node2",), exit_code=code)]) == [("requeue", 7)]


def test_a_node_failure_is_requeued_whatever_the_code() -> None:
    # NODE_FAIL is Slurm's word about the node, not the application's exit
    assert run_jobs([job(7, state="NODE_FAIL", nodes=("node2",), exit_code=93)]) == [("requeue", 7)]


def test_a_running_job_on_an_urgent_node_is_requeued() -> None:
    # a job still running has no exit code yet: the rule does not apply
    nodes = cluster(4)
    snap = Snapshot(
        nodes=nodes,
        jobs=[job(7, nodes=("node1", "node2"))],
        health={n: healthy() for n in nodes},
    )
    actions, _ = plan(snap, config(), NOW, {"node2"}, {})
    assert [(a.kind.value, a.job_id) for a in actions] == [("requeue", 7)]
