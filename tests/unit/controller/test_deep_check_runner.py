"""The deep-check runner's phases against an in-memory Slurm: where each node goes
after its run, repeatable steps, refusals and time limits (the real Slurm side is in
tests/integration/test_deep_check_drills.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ctl_helpers import NOW, cluster, node
from test_orphans import ME, OwnedSlurm

from hyperpod_agent.controller.config_deep import DeepCheckConfig
from hyperpod_agent.controller.deepcheck.outcomes import DRAIN_FIRST_REASON
from hyperpod_agent.controller.deepcheck.run import CheckRunner
from hyperpod_agent.controller.store.checks import CheckRun
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.deepcheck.model import CheckOutcome, CheckResult, SuiteResult

SPARE = "hyperpod:spare"
REBOOTED = "hyperpod:reboot gpu3 xid79 XID 79 : reboot issued"
SUITE = """
[[checks]]
name = "dcgm"
kind = "dcgm"
timeout_s = 60

[[checks]]
name = "nccl"
kind = "nccl"
min_busbw_gbps = 100
timeout_s = 60
"""


class World:
    def __init__(self, tmp_path: Path, store: Store) -> None:
        suite = tmp_path / "suite.toml"
        suite.write_text(SUITE)
        self.deep = DeepCheckConfig(suite=suite, results_dir=tmp_path / "results")
        self.store = store
        nodes = cluster(3)
        nodes["node4"] = node("node4", flags=("DRAIN",), reason=SPARE)
        nodes["node5"] = node("node5", flags=("DRAIN",), reason=REBOOTED)
        self.slurm = OwnedSlurm(nodes)
        self.escalated: list[tuple[str, str, str]] = []
        self.runner = CheckRunner(
            self.store,
            self.slurm,
            self.deep,
            ("root",),
            lambda *a: self.escalated.append(a),
        )
        self.now = NOW

    def plan(self, nodes: list[str], purpose: str, drain_first: bool = False) -> int:
        prior = {n: self.slurm.nodes[n].reason for n in nodes}
        event = EventIn("deep_check_planned", "planned")
        return self.store.add_check_run(
            nodes, "quick", purpose, prior, "test", drain_first, self.now, event
        )

    def run(self, run_id: int) -> CheckRun:
        found = self.store.check_run(run_id)
        assert found is not None
        return found

    def step(self, seconds: float = 2.0) -> None:
        self.now += seconds
        self.runner.advance(self.slurm.nodes, list(self.slurm.jobs.values()), self.now)

    def result(self, run_id: int, name: str, outcome: CheckOutcome, cause: str = "ok") -> None:
        out = self.deep.results_dir / self.run(run_id).reservation
        out.mkdir(parents=True, exist_ok=True)
        check = CheckResult(
            check="nccl", kind="nccl", outcome=outcome, cause=cause, duration_s=1.0,
            nodes=[name], gating=True,
        )  # fmt: skip
        suite = SuiteResult(
            level="quick", nodes=[name], started_at=datetime.now(UTC), duration_s=1.0,
            outcome=outcome, results=[check],
        )  # fmt: skip
        (out / f"{name}.json").write_text(suite.model_dump_json())

    def end_job(self, run_id: int, state: str = "COMPLETED") -> None:
        job_id = self.run(run_id).job_id
        assert job_id is not None
        self.slurm.jobs[job_id] = replace(self.slurm.jobs[job_id], state=state)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.store.events(limit=100)]


@pytest.fixture
def world(tmp_path: Path, store: Store) -> World:
    return World(tmp_path, store)  # on SQLite and on PostgreSQL (conftest.py)


def test_a_spare_run_goes_reserve_resume_submit_in_one_pass(world: World) -> None:
    rid = world.plan(["node4"], "spare")
    world.step()
    run = world.run(rid)
    assert run.phase == "running" and run.job_id is not None
    assert world.slurm.resv[run.reservation].nodes == ("node4",)
    assert not world.slurm.nodes["node4"].drained  # resumed inside the reservation
    script = (world.deep.results_dir / run.reservation / "check.sh").read_text()
    assert "--ntasks-per-node=1" in script and f"--out {world.deep.results_dir}" in script


@pytest.mark.parametrize(
    ("purpose", "outcome", "reason"),
    [
        ("spare", CheckOutcome.OK, SPARE),
        ("spare", CheckOutcome.FAIL, "hyperpod:hold deep-check nccl busbw 40 GB/s < floor"),
        ("spare", CheckOutcome.UNKNOWN, "hyperpod:hold deep-check nccl unknown: timed out"),
        ("reentry", CheckOutcome.OK, ""),
        ("reentry", CheckOutcome.FAIL, "hyperpod:hold deep-check nccl busbw 40 GB/s < floor"),
    ],
)
def test_each_outcome_puts_the_node_in_its_place(
    world: World, purpose: str, outcome: CheckOutcome, reason: str
) -> None:
    name = "node4" if purpose == "spare" else "node5"
    rid = world.plan([name], purpose)
    world.step()
    cause = {"FAIL": "busbw 40 GB/s < floor", "UNKNOWN": "timed out"}.get(outcome.value, "ok")
    world.result(rid, name, outcome, cause)
    world.end_job(rid)
    world.step()  # collects the result, restores the node, removes the reservation
    got = world.slurm.nodes[name]
    assert got.reason.startswith(reason) if reason else not got.drained
    assert got.drained == bool(reason)
    assert world.slurm.resv == {}
    assert world.run(rid).phase == "done"
    [outcome_row] = world.store.run_outcomes(rid)
    assert outcome_row.outcome == outcome.value and outcome_row.at == world.now
    failed_reentry = purpose == "reentry" and outcome is CheckOutcome.FAIL
    assert [e[0] for e in world.escalated] == (["node5"] if failed_reentry else [])


def test_a_node_without_a_result_is_unknown_and_held(world: World) -> None:
    rid = world.plan(["node4"], "spare")
    world.step()
    world.end_job(rid, "FAILED")
    world.step()
    world.step()
    [o] = world.store.run_outcomes(rid)
    assert o.outcome == "UNKNOWN" and "no result from node4" in o.cause and o.ran
    assert world.slurm.nodes["node4"].reason.startswith("hyperpod:hold deep-check - unknown")


def test_a_job_past_its_deadline_is_cancelled_and_unknown(world: World) -> None:
    rid = world.plan(["node4"], "spare")
    world.step()
    run = world.run(rid)
    assert run.deadline is not None
    world.step(run.deadline - world.now + 1)
    assert ("cancel", run.job_id) in world.slurm.calls
    world.step(120)  # the job never left: the run goes on without it
    [o] = world.store.run_outcomes(rid)
    assert o.outcome == "UNKNOWN" and "overran its time limit" in o.cause


def test_a_refused_reservation_restores_the_nodes_and_says_why(world: World) -> None:
    world.slurm.nodes["node2"] = replace(world.slurm.nodes["node2"], state="ALLOCATED")
    rid = world.plan(["node2"], "admin")
    world.step()
    world.step()
    run = world.run(rid)
    assert run.phase == "done" and "Requested nodes are busy" in run.error
    [o] = world.store.run_outcomes(rid)
    assert not o.ran and o.outcome == "UNKNOWN"
    assert not world.slurm.nodes["node2"].drained  # never touched
    assert not [c for c in world.slurm.calls if c[0] in ("drain", "resume", "submit")]
    assert "deep_check_failed" in world.kinds()


def test_a_node_that_changed_hands_before_the_resume_is_left_alone(world: World) -> None:
    rid = world.plan(["node5"], "reentry")
    human = "RMA 1234: cable"
    world.slurm.nodes["node5"] = replace(world.slurm.nodes["node5"], reason=human)
    world.step()
    world.step()
    assert world.run(rid).phase == "done"
    assert world.slurm.nodes["node5"].reason == human
    assert ("resume", "node5") not in world.slurm.calls


def test_every_step_repeats_safely_as_after_a_crash(world: World, tmp_path: Path) -> None:
    """A restarted controller replays the phase it died in: no second reservation,
    job, drain or event."""
    rid = world.plan(["node4"], "spare")
    world.step()
    run = world.run(rid)
    # the controller died after sbatch, before writing the job id: the job is found by name
    world.store.set_check_phase(rid, "submit", world.now)
    world.step()
    assert [c[0] for c in world.slurm.calls].count("submit") == 1
    assert world.run(rid).job_id == run.job_id
    world.result(rid, "node4", CheckOutcome.OK)
    world.end_job(rid)
    world.step()
    world.step()
    drains = [c for c in world.slurm.calls if c[0] == "drain"]
    world.store.set_check_phase(rid, "restore", world.now)  # died before writing done
    world.step()
    assert [c for c in world.slurm.calls if c[0] == "drain"] == drains
    assert world.slurm.nodes["node4"].reason == SPARE
    assert world.kinds().count("deep_check_ok") == 2  # once per completed restore


def test_drain_first_waits_for_the_jobs_and_resumes_after_an_ok(world: World) -> None:
    world.slurm.nodes["node1"] = replace(world.slurm.nodes["node1"], state="MIXED")
    rid = world.plan(["node1"], "admin", drain_first=True)
    world.step()
    assert world.slurm.nodes["node1"].reason == DRAIN_FIRST_REASON
    world.step()
    assert world.run(rid).phase == "draining"  # still running a job
    world.slurm.nodes["node1"] = replace(world.slurm.nodes["node1"], state="IDLE")
    world.step()
    assert world.run(rid).phase == "running"
    world.result(rid, "node1", CheckOutcome.OK)
    world.end_job(rid)
    world.step()
    world.step()
    assert not world.slurm.nodes["node1"].drained


def test_an_admin_check_keeps_a_humans_reason_whatever_the_outcome(world: World) -> None:
    human = "RMA 1234: cable"
    world.slurm.nodes["node2"] = replace(
        world.slurm.nodes["node2"], flags=frozenset({"DRAIN"}), reason=human
    )
    rid = world.plan(["node2"], "admin")
    world.step()
    world.result(rid, "node2", CheckOutcome.FAIL, "bad")
    world.end_job(rid)
    world.step()
    world.step()
    assert world.slurm.nodes["node2"].reason == human


def test_an_unreadable_result_file_is_unknown(world: World) -> None:
    rid = world.plan(["node4"], "spare")
    world.step()
    out = world.deep.results_dir / world.run(rid).reservation
    (out / "node4.json").write_text(json.dumps({"level": "quick"}))
    world.end_job(rid)
    world.step()
    [o] = world.store.run_outcomes(rid)
    assert o.outcome == "UNKNOWN" and "unreadable" in o.cause


def test_left_over_reservations_are_removed_and_their_nodes_held(world: World) -> None:
    from hyperpod_agent.slurm.maint import Reservation
    from hyperpod_agent.slurm.models import Job

    maint = frozenset({"MAINT"})
    orphan = Reservation("hyperpod-check-9-123", ("node1", "node4"), maint, ("root",), "ACTIVE")
    theirs = Reservation("site-maintenance", ("node2",), maint, ("root",), "ACTIVE")
    world.slurm.resv = {r.name: r for r in (orphan, theirs)}
    world.slurm.jobs[50] = Job(
        job_id=50, name=orphan.name, state="RUNNING", nodes=("node1",), uid=ME
    )
    rid = world.plan(["node3"], "admin")
    world.step()  # the run's own reservation is made in this pass too
    owned = world.run(rid).reservation
    assert set(world.slurm.resv) == {"site-maintenance", owned}
    assert ("cancel", 50) in world.slurm.calls
    assert world.slurm.nodes["node1"].reason.startswith("hyperpod:hold deep-check orphan")
    assert world.slurm.nodes["node4"].reason == SPARE  # a drained node is left as it is
    assert "deep_check_orphan" in world.kinds()
    world.slurm.resv["hyperpod-check-10-1"] = orphan
    world.step(60)  # swept again only after SWEEP_EVERY_S
    assert "hyperpod-check-10-1" in world.slurm.resv
