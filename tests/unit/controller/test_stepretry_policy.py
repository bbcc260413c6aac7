"""The policy and a step retry under way: neither the job-level requeue nor a remedy
of the node races the surgery, nor is its spare promised twice."""

from __future__ import annotations

from ctl_helpers import NOW, cluster, config, fault, faulty, healthy, job, node

from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.snapshot import Snapshot

XID79 = fault("node2", component="gpu3", code="xid79", action="REBOOT", urgent=True)
XID48 = fault("node3", component="gpu0", code="xid48", action="REBOOT", urgent=True)


def snapshot(step_retries: dict[int, tuple[str, str]]) -> Snapshot:
    nodes = cluster(21)  # room for two take-outs (2 of the 20 that are not the spare)
    nodes["node5"] = node("node5", flags=("DRAIN",), reason="hyperpod:spare")
    health = {n: healthy() for n in nodes}
    health.update({"node2": faulty(), "node3": faulty()})
    return Snapshot(
        nodes=nodes,
        jobs=[job(12, nodes=("node1", "node2")), job(13, nodes=("node3",))],
        health=health,
        open_faults=[XID79, XID48],
        history=[XID79, XID48],
        started_at=NOW - 3600,
        step_retries=step_retries,
    )


def plan(step_retries: dict[int, tuple[str, str]]) -> list[tuple[str, str, object]]:
    d = decide(snapshot(step_retries), config(), NOW)
    return [(a.kind.value, str(a.node or a.job_id), a.params.get("spare")) for a in d.actions]


def test_without_a_surgery_the_policy_replaces_and_requeues() -> None:
    assert ("replace", "node2", "node5") in plan({})
    assert ("requeue", "12", None) in plan({})


def test_a_job_in_surgery_is_not_requeued_and_its_node_not_remedied() -> None:
    actions = plan({12: ("node2", "node5")})
    assert [a for a in actions if a[1] in ("node2", "12")] == []
    # the other job's node gets no spare: the only one is going into job 12
    assert ("replace", "node3", "node5") not in actions
    assert ("reboot", "node3", None) in actions and ("requeue", "13", None) in actions


def test_a_surgerys_bad_node_counts_toward_the_blast_radius() -> None:
    # 4 nodes: one may be out. The surgery takes node2 out, so node3 must wait.
    snap = snapshot({12: ("node2", "node5")})
    small = {n: snap.nodes[n] for n in ("node1", "node2", "node3", "node4", "node5")}
    d = decide(Snapshot(**{**snap.__dict__, "nodes": small}), config(), NOW)
    assert d.incident and "node3" in d.incident_reason + " ".join(e.message for e in d.events)
    assert [a for a in d.actions if a.node == "node3"] == []


def test_a_watch_shields_only_a_job_slurm_shows_running() -> None:
    from hyperpod_agent.controller.snapshot import left_to_step_retry, retrying_in_place

    base = snapshot({})
    running = Snapshot(**{**base.__dict__, "watched_jobs": {12: None, 13: NOW - 5}})
    assert left_to_step_retry(running, NOW) == {12, 13}
    ended = [job(12, state="COMPLETED", nodes=("node1", "node2")), job(13, state="FAILED")]
    gone = Snapshot(**{**running.__dict__, "jobs": ended})
    assert left_to_step_retry(gone, NOW) == set()
    assert retrying_in_place(gone, NOW) == set()
