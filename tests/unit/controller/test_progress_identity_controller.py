"""The controller judges a job only on records the agents checked against the job's
user: ``JobProgress.uid`` must be the job's uid as Slurm shows it (DESIGN §12)."""

from __future__ import annotations

from dataclasses import replace

from ctl_helpers import NOW, config, healthy, job, node, ts

from hyperpod_agent.controller.hangs.judge import judge
from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.snapshot import NodeHealth, Snapshot
from hyperpod_agent.health import JobProgress, RankProgress
from hyperpod_agent.slurm.models import Job

JOB = 42
VICTIM = 1001
ATTACKER = 1002


def rank(r: int, state: str = "S") -> RankProgress:
    return RankProgress(
        rank=r,
        pid=1000 + r,
        step=100,
        step_at=NOW - 30,  # past any limit: hung if these ranks count
        window=64,
        median_s=0.45,
        p95_s=0.5,
        last_s=0.45,
        proc_state=state,
    )


def snapshot(uids: dict[str, int | None], job_uid: int | None = VICTIM) -> Snapshot:
    nodes = {f"node{i}": node(f"node{i}") for i in range(1, 5)}
    health = {n: healthy() for n in nodes}
    for i, (name, uid) in enumerate(uids.items()):
        state = "gone" if i else "S"
        jp = JobProgress(job_id=JOB, uid=uid, ranks=[rank(i, state)])
        health[name] = NodeHealth(healthy().verdict, NOW - 1, NOW - 1, progress=(jp,))
    j: Job = replace(
        job(JOB, nodes=tuple(uids), auto_resume=3), start_time=ts(NOW - 600), uid=job_uid
    )
    return Snapshot(nodes=nodes, jobs=[j], health=health, started_at=NOW - 3600)


def test_records_of_the_jobs_user_are_judged() -> None:
    snap = snapshot({"node1": VICTIM, "node2": VICTIM})
    [hang], _ = judge(snap, config().progress, NOW)
    assert hang.suspects == ("node2",)


def test_records_of_another_user_are_not_the_jobs() -> None:
    # An attacker's records for the victim's job, reported by an agent (an old one that
    # did not check the writer, or a node whose directory the attacker made first).
    snap = snapshot({"node1": ATTACKER, "node2": ATTACKER})
    assert judge(snap, config().progress, NOW) == ([], [])
    assert decide(snap, config(), NOW).actions == []


def test_one_nodes_foreign_records_cannot_name_that_node() -> None:
    # node2's records are the attacker's (its rank "gone"): left out, so the victim's
    # own records alone are judged and nothing points at node2.
    snap = snapshot({"node1": VICTIM, "node2": ATTACKER})
    [hang], _ = judge(snap, config().progress, NOW)
    assert hang.suspects == () and not hang.clear


def test_records_nobody_checked_are_not_judged_when_slurm_names_the_user() -> None:
    snap = snapshot({"node1": None, "node2": None})
    assert judge(snap, config().progress, NOW) == ([], [])


def test_without_the_users_uid_from_slurm_the_agents_check_stands() -> None:
    snap = snapshot({"node1": VICTIM, "node2": VICTIM}, job_uid=None)
    assert len(judge(snap, config().progress, NOW)[0]) == 1
