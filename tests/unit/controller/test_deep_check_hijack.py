"""A deep check's name is public (``GET /v1/checks``): any user can submit a held job
under it (``sbatch -H -J hyperpod-check-<id>-<t> --wrap true``). The run adopts only a
job this controller's user submitted, on the run's own nodes; the user's job is left
as it is, and the real check runs and judges the node."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_deep_check_runner import SPARE, World
from test_orphans import ME, ours, theirs

from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.deepcheck.model import CheckOutcome


@pytest.fixture
def world(tmp_path: Path, store: Store) -> World:
    return World(tmp_path, store)


def test_a_users_job_under_the_runs_name_is_not_adopted(world: World) -> None:
    rid = world.plan(["node4"], "spare")
    name = world.run(rid).reservation
    world.slurm.jobs[7] = theirs(7, name)  # held, outside the reservation
    world.step()
    run = world.run(rid)
    assert run.phase == "running" and run.job_id not in (None, 7)
    assert world.slurm.jobs[run.job_id or -1].uid == ME
    assert [c[1] for c in world.slurm.calls if c[0] == "submit"] == [name]
    world.result(rid, "node4", CheckOutcome.OK)
    world.end_job(rid)
    world.step()
    # judged by the real check: back in the pool, qualified; nothing of the user's touched
    assert world.slurm.nodes["node4"].reason == SPARE
    [outcome] = world.store.run_outcomes(rid)
    assert outcome.outcome == "OK"
    assert world.slurm.jobs[7] == theirs(7, name)
    assert ("cancel", 7) not in world.slurm.calls


def test_after_a_restart_only_our_job_is_found_by_name(world: World) -> None:
    world.slurm.jobs[5] = theirs(5, "train")  # our job's id comes after it
    rid = world.plan(["node4"], "spare")
    world.step()
    ours_id = world.run(rid).job_id
    name = world.run(rid).reservation
    world.slurm.jobs[3] = theirs(3, name, "RUNNING", ["node1"])  # a lower id
    world.store.set_check_phase(rid, "submit", world.now)  # died before the job id
    world.step()
    assert world.run(rid).job_id == ours_id
    assert [c[0] for c in world.slurm.calls].count("submit") == 1


def test_a_job_of_ours_on_other_nodes_is_not_the_runs(world: World) -> None:
    rid = world.plan(["node4"], "spare")
    name = world.run(rid).reservation
    world.slurm.jobs[2] = ours(2, name, "RUNNING", ["node1"])
    world.step()
    assert world.run(rid).job_id not in (None, 2)


def test_a_users_job_under_an_old_runs_name_is_never_cancelled(world: World) -> None:
    rid = world.plan(["node4"], "spare")
    world.step()
    name = world.run(rid).reservation
    world.slurm.jobs[3] = theirs(3, name)
    deadline = world.run(rid).deadline
    assert deadline is not None
    world.step(deadline - world.now + 1)  # past the deadline: our job is cancelled
    world.step(120)  # it never left: the run goes on without it
    world.step()
    assert world.run(rid).phase == "done"
    assert ("cancel", 3) not in world.slurm.calls and world.slurm.jobs[3] == theirs(3, name)
