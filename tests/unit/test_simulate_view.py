"""The policy's view of the simulated cluster (simulate/cluster.py): what it leaves out,
what it carries for what it leaves out, and that the policy decides the same on it as on
the whole cluster, the blast radius biting included."""

from __future__ import annotations

import pytest

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.safety import allowed_out
from hyperpod_agent.reasons import Verb, format_reason
from hyperpod_agent.simulate.causes import CLASSES
from hyperpod_agent.simulate.cluster import Cluster, JobState, Role, view
from hyperpod_agent.simulate.engine import Sim
from hyperpod_agent.simulate.inputs import load_inputs
from hyperpod_agent.simulate.passes import open_fault
from hyperpod_agent.simulate.result import Scenario, Strategy
from hyperpod_agent.simulate.run import FaultSource, make_faults

INPUTS = load_inputs()
NOW = 2_000_000_000.0


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
