"""A newly provisioned worker joins drained under the reason that asks the controller
for its first deep check, once, and never over somebody else's drain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hyperpod_agent.errors import SlurmError
from hyperpod_agent.provision.apply import Retry, apply_plan
from hyperpod_agent.provision.join import MARKER, JoinDrained
from hyperpod_agent.provision.layout import Layout
from hyperpod_agent.provision.load import parse_parameters
from hyperpod_agent.provision.plan import Options, Plan, Role, build_plan
from hyperpod_agent.provision.steps import Context, StepError
from hyperpod_agent.reasons import FIRST_USE, SPARE, Owner, Verb, owner_of, parse_reason
from hyperpod_agent.slurm.models import Node


class FakeSlurm:
    def __init__(self, node: Node, fail: bool = False) -> None:
        self.current, self.fail = node, fail
        self.drains: list[tuple[str, str]] = []

    def node(self, name: str) -> Node:
        if self.fail:
            raise SlurmError(["scontrol", "show", "node", name], 1, "", "Unable to contact slurm")
        return self.current

    def drain(self, node: str, reason: str) -> None:
        self.drains.append((node, reason))
        self.current = Node(node, self.current.state, frozenset({"DRAIN"}), reason)


def step(tmp_path: Path, slurm: FakeSlurm, spare: bool = False) -> JoinDrained:
    return JoinDrained("node1", spare, tmp_path / MARKER, lambda: slurm)


def test_the_first_use_reason_is_ours_and_asks_for_the_check() -> None:
    ours = parse_reason(FIRST_USE)
    assert ours is not None and ours.verb is Verb.CHECK
    drained = Node("node1", "IDLE", frozenset({"DRAIN"}), FIRST_USE)
    assert owner_of(drained, ("slurm",)) is Owner.US


@pytest.mark.parametrize(
    "current",
    [
        Node("node1", "IDLE"),  # registered already, in service
        Node("node1", "DOWN", frozenset({"NOT_RESPONDING"}), "Not responding", "slurm"),
    ],
)
def test_a_new_worker_is_drained_once_then_left(tmp_path: Path, current: Node) -> None:
    slurm = FakeSlurm(current)
    join = step(tmp_path, slurm)
    change = join.inspect(Context())
    assert change is not None and FIRST_USE in change.summary
    join.apply(Context())
    assert slurm.drains == [("node1", FIRST_USE)]
    assert join.inspect(Context()) is None  # a re-run of provisioning drains nothing
    assert "drained with reason" in (tmp_path / MARKER).read_text()


def test_a_spare_joins_the_pool(tmp_path: Path) -> None:
    slurm = FakeSlurm(Node("node5", "IDLE"))
    JoinDrained("node5", True, tmp_path / MARKER, lambda: slurm).apply(Context())
    assert slurm.drains == [("node5", SPARE)]


@pytest.mark.parametrize(
    "reason",
    [
        "RMA 1234 -- alice",  # a human's
        "hyperpod:replace gpu0 xid54 x",  # the controller's, replacing the machine
        "Action:Reboot",
        SPARE,
    ],
)
def test_a_node_somebody_drained_is_left_as_it_is(tmp_path: Path, reason: str) -> None:
    slurm = FakeSlurm(Node("node1", "IDLE", frozenset({"DRAIN"}), reason, "alice"))
    step(tmp_path, slurm).apply(Context())
    assert slurm.drains == []
    assert "left as it is" in (tmp_path / MARKER).read_text()


def test_slurm_not_answering_fails_the_step_and_writes_no_marker(tmp_path: Path) -> None:
    slurm = FakeSlurm(Node("node1", "IDLE"), fail=True)
    join = step(tmp_path, slurm)
    with pytest.raises(StepError, match="couldn't drain it for its first check"):
        join.apply(Context())
    assert not (tmp_path / MARKER).exists() and join.network  # retried, then again next run


def plan_steps(params: dict[str, Any], node: str, source: Path, **kw: Any) -> list[Any]:
    plan = build_plan(parse_parameters(params, "p"), node, Options(source=source, **kw))
    return [s for s in plan.steps if isinstance(s, JoinDrained)]


def test_workers_get_the_step_head_and_login_nodes_do_not(
    params: dict[str, Any], source: Path
) -> None:
    [worker] = plan_steps(params, "node1", source)
    assert worker.reason == FIRST_USE
    assert worker.marker == Path("/var/lib/hyperpod") / MARKER
    [spare] = plan_steps(params, "node5", source)
    assert spare.reason == SPARE
    assert plan_steps(params, "head", source) == []
    assert plan_steps(params, "login1", source) == []


def test_inside_a_prefix_nothing_is_asked_of_slurm(
    params: dict[str, Any], source: Path, prefix: Path
) -> None:
    assert plan_steps(params, "node1", source, prefix=prefix) == []


def test_in_observe_mode_a_new_worker_is_not_drained_and_its_agent_observes(
    params: dict[str, Any], source: Path
) -> None:
    """The controller would never resume it: nothing of the rollout's first week
    drains a node, and the agent's self-drain observes with the controller."""
    observing = {**params, "controller_overrides": {"policy": {"mode": "observe"}}}
    assert plan_steps(observing, "node1", source) == []
    plan = build_plan(parse_parameters(observing, "p"), "node1", Options(source=source))
    agent_toml = next(s for s in plan.steps if getattr(s, "path", Path()).name == "agent.toml")
    assert 'mode = "observe"' in agent_toml.desired(None).decode()
    [acting] = plan_steps(params, "node1", source)
    assert acting.reason == FIRST_USE
    [spare] = plan_steps(observing, "node5", source)  # the pool the parameters name
    assert spare.reason == SPARE


def test_the_step_runs_in_a_real_apply(tmp_path: Path) -> None:
    """Through apply_plan, as provisioning runs it: changed once, then unchanged."""
    slurm = FakeSlurm(Node("node1", "IDLE"))
    params = parse_parameters(
        {
            "cluster_name": "t",
            "controller": {"nodes": ["head"]},
            "worker_groups": [{"name": "gpu", "nodes": ["node1"], "partitions": ["main"]}],
            "partitions": [{"name": "main", "default": True}],
            "controller_url": "http://127.0.0.1:1",
        },
        "p",
    )
    lay = Layout.for_params(params, tmp_path)
    join = JoinDrained("node1", False, lay.state_dir / MARKER, lambda: slurm)
    plan = Plan("node1", Role("worker", "gpu"), lay, [join], [])
    first = apply_plan(plan, verify=False, retry=Retry(attempts=1))
    assert [o.name for o in first.changed] == [join.name] and slurm.drains == [("node1", FIRST_USE)]
    again = apply_plan(plan, verify=False, retry=Retry(attempts=1))
    assert again.changed == [] and len(slurm.drains) == 1
