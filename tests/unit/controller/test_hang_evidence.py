"""How old a report is and whether its agent still speaks are part of the hang
judgement: idle time is measured on the ranks' own clock, up to when their node's
report is known current; a node not heard from is unknown, and unknown is never hung;
a hang counts after two consecutive judgements (DESIGN §12, docs/controller.md)."""

from __future__ import annotations

from dataclasses import replace

from ctl_helpers import NOW, config, healthy, job, node, ts

from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.agent.reporter import ReporterConfig
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.hangs.judge import STALE_S, judge
from hyperpod_agent.controller.hangs.memory import HangMemory
from hyperpod_agent.controller.snapshot import NodeHealth, Snapshot
from hyperpod_agent.health import JobProgress, RankProgress
from hyperpod_agent.slurm.models import Job

JOB = 42
CFG = config().progress


def ranks(at: float, r: int = 0, state: str = "S") -> JobProgress:
    rank = RankProgress(
        rank=r, pid=100 + r, step=50, step_at=at, window=64, median_s=0.4, p95_s=0.5,
        proc_state=state,
    )  # fmt: skip
    return JobProgress(job_id=JOB, ranks=[rank])


def snapshot(reports: dict[str, tuple[float, float, JobProgress]]) -> Snapshot:
    """node -> (generated_at on its clock, last heard on ours, its progress)."""
    health = {n: healthy() for n in ("node1", "node2", "node3")}
    for name, (generated, heard, jp) in reports.items():
        health[name] = NodeHealth(healthy().verdict, generated, heard, progress=(jp,))
    j: Job = replace(job(JOB, nodes=tuple(reports)), start_time=ts(NOW - 600))
    return Snapshot(nodes={n: node(n) for n in health}, jobs=[j], health=health)


def test_the_shipped_cadences_make_a_heartbeat_an_attestation() -> None:
    # A heartbeat says "the report as sent": the agent sends progress in full at most
    # every progress_report_interval_s, and only that being shorter than its heartbeat
    # interval makes a heartbeat mean the progress did not move either.
    agent = AgentConfig(node_name="n")
    beat = ReporterConfig().heartbeat_interval_s
    assert agent.effective_progress_report_interval_s() <= beat
    # Unknown after two heartbeats missed, before the agent counts as lost.
    assert STALE_S == 2 * beat < ControllerConfig().policy.heartbeat_timeout_s


def test_idle_is_measured_on_the_ranks_clock_up_to_the_report() -> None:
    # The last step 2 s before the report; the report 40 s old by our clock (a slow
    # pass, a late report, an agent gone quiet): 2 s idle as far as anyone knows.
    old = snapshot({"node1": (NOW - 40, NOW - 40, ranks(NOW - 42))})
    assert judge(old, CFG, NOW) == ([], [])
    # The same on a node whose clock is an hour ahead, or behind (less than the job has
    # run: records older than its start are an earlier run's): only its own counts.
    for skew in (3600.0, -300.0):
        skewed = snapshot({"node1": (NOW + skew, NOW, ranks(NOW + skew - 2))})
        assert judge(skewed, CFG, NOW) == ([], [])
        stuck = snapshot({"node1": (NOW + skew, NOW, ranks(NOW + skew - 9))})
        [hang], _ = judge(stuck, CFG, NOW)
        assert hang.idle_s == 9.0


def test_a_node_not_heard_from_is_unknown_and_unknown_is_never_hung() -> None:
    # Its report says 30 s idle, but nobody heard from it for over a minute: an agent
    # restarting, a partition. The job's other node is idle too: still not judged.
    quiet = (NOW - 10, NOW - STALE_S - 1, ranks(NOW - 40))
    assert judge(snapshot({"node1": quiet}), CFG, NOW) == ([], [])
    loud = (NOW, NOW, ranks(NOW - 30, r=1, state="T"))
    assert judge(snapshot({"node1": quiet, "node2": loud}), CFG, NOW) == ([], [])
    heard = (NOW - 10, NOW - STALE_S + 1, ranks(NOW - 40))
    [hang], _ = judge(snapshot({"node1": heard, "node2": loud}), CFG, NOW)
    assert hang.suspects == ("node2",)


def test_a_heartbeat_of_the_same_agent_carries_the_report_forward() -> None:
    # The only news of a hung job: its agent's heartbeats ("nothing changed").
    mem = HangMemory()
    mem.report("node1", "a1", 9, NOW - 65, NOW - 65)
    mem.report("node1", "a1", 10, NOW - 60, NOW - 60)  # the last step 1 s before it
    snap = snapshot({"node1": (NOW - 60, NOW - 1, ranks(NOW - 61))})
    assert judge(snap, CFG, NOW, mem) == ([], [])  # 1 s idle, and 60 s unheard: unknown
    mem.heartbeat("node1", "a1", 22, NOW - 1, NOW - 1)
    judge(snap, CFG, NOW, mem)  # first judgement
    [hang], _ = judge(snap, CFG, NOW + 10, mem)  # second, consecutive: declared
    # Report 22 was built twelve 5 s cycles after report 10, at NOW on the node's
    # clock, but the heartbeat naming it went out at NOW - 1: no later than that. Up
    # to there, 60 s idle (the heartbeat less a cycle, as once, said 55 s).
    assert hang.idle_s == 60.0


def test_a_restarted_agents_heartbeat_carries_nothing_forward() -> None:
    mem = HangMemory()
    mem.report("node1", "a1", 9, NOW - 25, NOW - 25)
    mem.report("node1", "a1", 10, NOW - 20, NOW - 20)
    mem.heartbeat("node1", "a2", 1, NOW - 1, NOW - 1)  # a new agent, its report not in yet
    snap = snapshot({"node1": (NOW - 20, NOW - 1, ranks(NOW - 21))})
    assert judge(snap, CFG, NOW, mem) == ([], [])
    assert judge(snap, CFG, NOW + 10, mem) == ([], [])


def test_a_hang_is_declared_by_the_second_consecutive_judgement() -> None:
    mem = HangMemory()
    hung = snapshot({"node1": (NOW, NOW, ranks(NOW - 9)), "node2": (NOW, NOW, ranks(NOW - 9, 1))})
    assert judge(hung, CFG, NOW, mem) == ([], [])
    assert mem.suspects() == {JOB}
    [hang], _ = judge(hung, CFG, NOW + 10, mem)
    assert hang.job_id == JOB and not hang.declared


def test_progress_between_two_judgements_starts_over() -> None:
    mem = HangMemory()
    hung = snapshot({"node1": (NOW, NOW, ranks(NOW - 9))})
    judge(hung, CFG, NOW, mem)
    moving = snapshot({"node1": (NOW + 5, NOW + 5, ranks(NOW + 4))})
    assert judge(moving, CFG, NOW + 5, mem) == ([], [])
    assert mem.suspects() == frozenset()
    assert judge(hung, CFG, NOW + 10, mem) == ([], [])  # a first judgement again


def test_without_a_memory_one_judgement_is_the_hang() -> None:
    # As the policy calls it until it passes the controller's memory.
    hung = snapshot({"node1": (NOW, NOW, ranks(NOW - 9))})
    [hang], _ = judge(hung, CFG, NOW)
    assert hang.idle_s == 9.0
