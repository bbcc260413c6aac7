"""The policy's view of the simulated cluster (simulate/cluster.py): what it leaves out,
what it carries for what it leaves out, and that the policy decides the same on it as on
the whole cluster, the blast radius biting included."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.safety import allowed_out
from hyperpod_agent.controller.snapshot import Kind, PlannedAction, Snapshot
from hyperpod_agent.controller.stepretry.plan import StepFailure, decide_step
from hyperpod_agent.reasons import Verb, format_reason
from hyperpod_agent.simulate import passes
from hyperpod_agent.simulate.causes import CLASSES
from hyperpod_agent.simulate.cluster import Cluster, JobState, Role
from hyperpod_agent.simulate.engine import Sim
from hyperpod_agent.simulate.inputs import load_inputs
from hyperpod_agent.simulate.passes import open_fault
from hyperpod_agent.simulate.result import Scenario, Strategy
from hyperpod_agent.simulate.run import FaultSource, make_faults
from hyperpod_agent.simulate.view import snapshot, view

INPUTS = load_inputs()
NOW = 2_000_000_000.0
Dead = dict[int, float]  # node -> when its heartbeat stopped


def _held(cluster: Cluster, i: int, verb: Verb, replaced: bool) -> None:
    """Node ``i`` out for repair under our ``verb`` reason, with its fault open."""
    open_fault(cluster, i, CLASSES["gpu_xid"], NOW - 600.0)
    n = cluster.nodes[i]
    n.role, n.reason, n.reason_time = Role.OUT, format_reason(verb, "gpu", "xid79"), NOW - 600
    n.held, n.replaced = True, replaced
    cluster.touch(i)


def _cluster() -> tuple[Cluster, JobState]:
    cluster = Cluster(40, 4, ControllerConfig())
    job = JobState(1, 3, set(range(30)), 0, start_time=NOW - 3600.0)
    for i in range(30, 36):
        cluster.nodes[i].role = Role.IDLE  # in service, not in the job
    _held(cluster, 30, Verb.REPLACE, replaced=True)  # its spare came in
    _held(cluster, 31, Verb.REPLACE, replaced=False)  # no spare was left
    _held(cluster, 32, Verb.HOLD, replaced=False)  # a lemon
    return cluster, job


def test_nodes_held_for_repair_are_left_out_but_their_faults_stay() -> None:
    cluster, job = _cluster()
    snap, _ = view(cluster, job, NOW, {})
    held = {"n00030", "n00031", "n00032"}
    assert not held & set(snap.nodes)
    assert {f.node for f in snap.open_faults} == held  # a shared cause still counts them


def test_held_nodes_that_count_against_the_blast_radius_come_off_the_limit() -> None:
    cluster, job = _cluster()
    _, config = view(cluster, job, NOW, {})
    members = 40 - 4  # the spares are not part of the partition's share
    real = allowed_out(ControllerConfig().policy, members)
    # n00030 is replaced (its spare took its place): only the other two count
    assert config.policy.min_unhealthy_nodes == real - 2
    assert allowed_out(config.policy, 5) == real - 2  # whatever the view's size


def test_a_held_node_listed_in_the_job_stays_in_the_view() -> None:
    cluster, job = _cluster()
    job.nodes.add(31)  # an ended job still lists it
    snap, config = view(cluster, job, NOW, {})
    assert "n00031" in snap.nodes and "n00030" not in snap.nodes
    real = allowed_out(ControllerConfig().policy, 36)
    assert config.policy.min_unhealthy_nodes == real - 1  # the view counts n00031 itself


def _run(s: Scenario, full_view: bool) -> dict[str, object]:
    faults = make_faults(s, FaultSource(rate=100.0), INPUTS)
    return Sim(s, faults, INPUTS, full_view=full_view).run().to_dict(incidents=1000)


@pytest.mark.parametrize("strategy", [Strategy.REQUEUE, Strategy.STEP_RETRY])
def test_the_view_decides_as_the_whole_cluster_when_the_blast_radius_bites(
    strategy: Strategy,
) -> None:
    # Many faults, long repairs, few spares: nodes held for repair pile up past the limit
    # (decided on the view without taking them off its limit, this run comes out otherwise)
    s = Scenario(60, 2, 8, 10.0, 1800.0, strategy, seed=2)
    reduced, whole = _run(s, False), _run(s, True)
    assert reduced == whole
    assert isinstance(reduced["incident_mode_passes"], int)
    assert reduced["incident_mode_passes"] > 0  # the limit was reached


# -- the lean view: idle nodes no decision depends on (Cluster.lean) ----------------------


def _filing(cluster: Cluster) -> tuple[object, ...]:
    return (
        set(cluster.play),
        {r: set(m) for r, m in cluster.roles.items()},
        dict(cluster.held),
        set(cluster.timed),
        set(cluster.inert),
    )


def _comparable(actions: list[PlannedAction]) -> list[PlannedAction]:
    """A decision's actions as the simulation carries them out. What lists the job's
    nodes (shorter in any view) is never read: a requeue's ``nodes``, the cause of a
    "not retried" notice."""
    return [
        replace(
            a,
            cause="" if a.kind is Kind.NOT_RETRIED else a.cause,
            params={k: v for k, v in a.params.items() if k != "nodes"},
        )
        for a in actions
    ]


class Checked:
    """Every pass and step decision of a run also decided on the view before ``lean``
    left anything out: the same actions, the same incident, the same step plan. And the
    nodes' filing (``Cluster.touch``) is up to date at every pass: filing every node
    again changes nothing."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.passes = self.step_views = 0
        self.left_out = {"idle": 0, "listed": 0}
        self.states: set[str] = set()
        monkeypatch.setattr(passes, "view", self.view)

    def view(
        self, cluster: Cluster, job: JobState, now: float, dead: Dead, step: bool = False
    ) -> tuple[Snapshot, ControllerConfig]:
        filed = _filing(cluster)
        for i in range(len(cluster.nodes)):
            cluster.touch(i)
        assert _filing(cluster) == filed
        snap, config = view(cluster, job, now, dead, step)
        idx, held = cluster.in_play(job)
        whole = snapshot(cluster, job, now, dead, idx, held)
        gone = set(whole.nodes) - set(snap.nodes)
        listed = gone & set(whole.jobs[0].nodes)
        self.left_out["listed"] += len(listed)
        self.left_out["idle"] += len(gone - listed)
        if gone:
            self.states.add(job.slurm_state)
        if step:
            self.step_views += 1
            assert snap.jobs[0].nodes == whole.jobs[0].nodes  # listed nodes all stay
            failure = StepFailure(
                job.job_id, "0", 1, snap.jobs[0].nodes, job.retries_done + 1,
                started_at=job.start_time,
            )  # fmt: skip
            rest = (config, now, job.retries_done, len(cluster.retry_times))
            assert decide_step(snap.jobs[0], failure, snap, *rest) == decide_step(
                whole.jobs[0], failure, whole, *rest
            )
        else:
            self.passes += 1
            lean, full = decide(snap, config, now), decide(whole, config, now)
            assert _comparable(lean.actions) == _comparable(full.actions)
            assert lean.incident == full.incident
        return snap, config


@pytest.mark.parametrize("strategy", [Strategy.REQUEUE, Strategy.STEP_RETRY])
def test_the_lean_view_decides_as_the_view_before_it_every_pass(
    strategy: Strategy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No spares and long repairs: the job waits for capacity (failed, then pending)
    # while repaired nodes come back idle, its own listed ones among them.
    s = Scenario(60, 0, 8, 20.0, 1800.0, strategy, seed=3)
    checked = Checked(monkeypatch)
    _run(s, False)
    assert checked.passes > 100
    assert checked.left_out["listed"] > 1000
    assert {"FAILED", "PENDING"} <= checked.states
    if strategy is Strategy.STEP_RETRY:
        assert checked.step_views > 0


@pytest.mark.parametrize("listed", [0, 6])
def test_the_lean_view_keeps_enough_idle_nodes_for_the_capacity_check(listed: int) -> None:
    # A failed job of 20 listed nodes: its batch host n00000 in service, n00001-n00003
    # held for repair (the fault that ended it), ``listed`` more back in service, idle;
    # n00020 on idle outside the job. Usable: 1 + listed + idle against 4 + listed.
    for idle in range(8):
        cluster = Cluster(40, 4, ControllerConfig())
        job = JobState(1, 3, set(range(20)), 0, start_time=NOW - 7200.0)
        job.slurm_state, job.end_time = "FAILED", NOW - 300.0
        for i in (1, 2, 3):
            _held(cluster, i, Verb.REPLACE, replaced=False)
        for i in [*range(4, 4 + listed), *range(20, 20 + idle)]:
            cluster.nodes[i].role = Role.IDLE
            cluster.touch(i)
        snap, config = view(cluster, job, NOW, {})
        idx, held = cluster.in_play(job)
        whole = snapshot(cluster, job, NOW, {}, idx, held)
        assert len(whole.nodes) - len(snap.nodes) == listed + max(0, idle - 4)
        lean, full = decide(snap, config, NOW), decide(whole, config, NOW)
        assert _comparable(lean.actions) == _comparable(full.actions)
        requeued = [a for a in lean.actions if a.kind is Kind.REQUEUE]
        assert bool(requeued) == (idle >= 3)  # it waits for capacity below 3


@pytest.mark.parametrize("strategy", list(Strategy))
def test_the_filing_is_up_to_date_after_a_run(strategy: Strategy) -> None:
    s = Scenario(60, 2, 8, 10.0, 1800.0, strategy, seed=2)
    sim = Sim(s, make_faults(s, FaultSource(rate=100.0), INPUTS), INPUTS)
    sim.run()
    filed = _filing(sim.cluster)
    for i in range(len(sim.cluster.nodes)):
        sim.cluster.touch(i)
    assert _filing(sim.cluster) == filed
