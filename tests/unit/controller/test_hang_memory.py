"""What the hang judgement remembers between passes (hangs/memory.py): until when a
node's report is known current, which jobs await their second judgement, when news
should run the pass at once, and its bounds."""

from __future__ import annotations

import pytest
from ctl_helpers import NOW

from hyperpod_agent.controller.config import ProgressConfig
from hyperpod_agent.controller.hangs import memory as memory_module
from hyperpod_agent.controller.hangs.judge import Hang
from hyperpod_agent.controller.hangs.memory import MAX_CYCLE_S, HangMemory
from hyperpod_agent.health import JobProgress, RankProgress

SKEW = 3600.0  # the node's clock runs an hour ahead: nothing here compares the two clocks


def progress(job_id: int = 7, step_at: float = NOW + SKEW - 1, p95: float = 0.5) -> JobProgress:
    rank = RankProgress(
        rank=0, pid=1, step=100, step_at=step_at, window=64, median_s=0.4, p95_s=p95
    )
    return JobProgress(job_id=job_id, ranks=[rank])


def reported(mem: HangMemory, seq: int = 10, at: float = NOW, agent: str = "a1") -> None:
    """Two reports 5 s apart (a 5 s agent cycle), the last at ``at`` (controller clock)."""
    mem.report("n1", agent, seq - 1, at + SKEW - 5, at - 5, [progress()])
    mem.report("n1", agent, seq, at + SKEW, at, [progress()])


def hang(job_id: int = 7, step: int = 100, restart: int = 0) -> Hang:
    return Hang(job_id, restart, step, 9.0, 5.0, 0.5, ("n1",), "n1: rank 0 state T", False)


# -- evidence -----------------------------------------------------------------------------
def test_a_report_is_current_as_of_its_own_time() -> None:
    mem = HangMemory()
    reported(mem)
    assert mem.evidence("n1", NOW + SKEW) == (NOW + SKEW, NOW)
    assert mem.evidence("n1", NOW + SKEW - 5) is None  # not the stored report
    assert mem.evidence("n2", NOW + SKEW) is None


def test_a_heartbeat_is_dated_by_the_report_it_names() -> None:
    mem = HangMemory()
    reported(mem)
    mem.heartbeat("n1", "a1", 16, NOW + SKEW + 30, NOW + 30.4)
    # Report 16 was built six 5 s cycles after report 10 (the reports show the cycle):
    # the heartbeat says nothing changed up to then. (Dated by its sending less a cycle,
    # as once, it would say 25 s: a heartbeat more was needed to see a stop.)
    assert mem.evidence("n1", NOW + SKEW) == (NOW + SKEW + 30, NOW + 30.4)
    # Sent later than the report it names was built (the agent's sender waited):
    # still the report's time, not the sending's.
    mem.heartbeat("n1", "a1", 17, NOW + SKEW + 38, NOW + 38.4)
    assert mem.evidence("n1", NOW + SKEW) == (NOW + SKEW + 35, NOW + 38.4)


def test_a_heartbeat_is_never_dated_after_it_was_sent() -> None:
    # The second report was built late in its cycle: the reports show a 5.8 s cycle,
    # longer than the agent's. Six of those would date report 16 after the heartbeat
    # naming it went out; it was built before.
    mem = HangMemory()
    mem.report("n1", "a1", 9, NOW + SKEW - 5.8, NOW - 5.8, [progress()])
    mem.report("n1", "a1", 10, NOW + SKEW, NOW, [progress()])
    mem.heartbeat("n1", "a1", 16, NOW + SKEW + 30.1, NOW + 30.2)
    assert mem.evidence("n1", NOW + SKEW) == (NOW + SKEW + 30.1, NOW + 30.2)


def test_a_slowed_agents_heartbeat_attests_only_the_cycles_it_made() -> None:
    # The agent's cycles overran (a probe taking long): in 30 s it built two reports,
    # not six. Its progress is known up to the second, not up to the heartbeat less a
    # cycle (25 s, as once): a rank may have stepped since, unread.
    mem = HangMemory()
    reported(mem)
    mem.heartbeat("n1", "a1", 12, NOW + SKEW + 30, NOW + 30)
    assert mem.evidence("n1", NOW + SKEW) == (NOW + SKEW + 10, NOW + 30)


def test_a_heartbeat_naming_the_stored_report_attests_nothing_past_it() -> None:
    # The agent's loop built no report since (stuck, say, reading records on a hung
    # filesystem) while its sender still speaks: the node is heard from, its progress
    # is known only as of that report.
    mem = HangMemory()
    reported(mem)
    assert not mem.heartbeat("n1", "a1", 10, NOW + SKEW + 30, NOW + 30)
    assert mem.evidence("n1", NOW + SKEW) == (NOW + SKEW, NOW + 30)


def test_a_heartbeat_of_another_agent_or_an_older_report_attests_nothing() -> None:
    mem = HangMemory()
    reported(mem)
    assert not mem.heartbeat("n1", "a2", 3, NOW + SKEW + 30, NOW + 30)  # restarted agent
    assert not mem.heartbeat("n1", "a1", 9, NOW + SKEW + 30, NOW + 30)  # before the report
    assert not mem.heartbeat("n2", "a1", 16, NOW + SKEW + 30, NOW + 30)  # no report
    assert mem.evidence("n1", NOW + SKEW) == (NOW + SKEW, NOW)


def test_an_agent_seen_once_is_given_the_longest_cycle_until_its_heartbeat_shows_it() -> None:
    # A controller that just started knows one report of the agent: a heartbeat six
    # cycles later shows the cycle, a little long (it went out after its report).
    mem = HangMemory()
    mem.report("n1", "a1", 10, NOW + SKEW, NOW, [progress()])
    mem.heartbeat("n1", "a1", 10, NOW + SKEW + 4, NOW + 4)  # the same report: no cycle
    assert mem.evidence("n1", NOW + SKEW) == (NOW + SKEW, NOW + 4)  # 4 - 60 < 0
    mem.heartbeat("n1", "a1", 16, NOW + SKEW + 31, NOW + 31)
    until, _ = mem.evidence("n1", NOW + SKEW) or (0.0, 0.0)
    assert until == pytest.approx(NOW + SKEW + 31 - 31 / 6)
    assert MAX_CYCLE_S == 60.0


def test_a_new_report_restarts_the_evidence() -> None:
    mem = HangMemory()
    reported(mem)
    mem.heartbeat("n1", "a1", 16, NOW + SKEW + 30, NOW + 30)
    mem.report("n1", "a1", 17, NOW + SKEW + 35, NOW + 35, [progress()])
    assert mem.evidence("n1", NOW + SKEW + 35) == (NOW + SKEW + 35, NOW + 35)


# -- waking the loop ----------------------------------------------------------------------
def test_a_heartbeat_that_takes_a_job_past_its_limit_wakes_the_loop_once() -> None:
    # Last step 1 s before the report, limit max(3 x 0.5, 5) = 5 s: the first heartbeat
    # attests 25 s of idle, past it; the next ones add nothing new.
    mem = HangMemory()
    reported(mem)
    assert mem.heartbeat("n1", "a1", 16, NOW + SKEW + 30, NOW + 30)
    assert not mem.heartbeat("n1", "a1", 22, NOW + SKEW + 60, NOW + 60)


def test_a_heartbeat_within_the_limit_or_of_a_paused_job_does_not_wake_it() -> None:
    mem = HangMemory()
    mem.report("n1", "a1", 9, NOW + SKEW - 5, NOW - 5, [progress(p95=20.0)])  # limit 60 s
    mem.report("n1", "a1", 10, NOW + SKEW, NOW, [progress(p95=20.0)])
    assert not mem.heartbeat("n1", "a1", 16, NOW + SKEW + 30, NOW + 30)
    paused = progress().model_copy(
        update={"ranks": [progress().ranks[0].model_copy(update={"paused": True})]}
    )
    mem.report("n2", "a1", 10, NOW + SKEW, NOW, [paused])
    assert not mem.heartbeat("n2", "a1", 16, NOW + SKEW + 60, NOW + 60)


def test_news_of_a_job_judged_hung_once_wakes_the_loop() -> None:
    mem = HangMemory()
    assert mem.confirm([hang()], {7: ("n1", "n2")}) == []
    assert mem.suspects() == {7}
    assert mem.report("n2", "b1", 1, NOW + 1, NOW + 1, [])  # its node: a heartbeat names no job
    assert mem.report("n9", "c1", 1, NOW + 1, NOW + 1, [progress(job_id=7)])  # its records
    assert not mem.report("n9", "c1", 2, NOW + 6, NOW + 6, [progress(job_id=8)])
    mem.report("n1", "a1", 1, NOW, NOW, [])
    assert mem.heartbeat("n1", "a1", 2, NOW + 5, NOW + 5)
    mem.confirm([hang()], {7: ("n1", "n2")})  # confirmed: nothing more to wake for
    assert mem.suspects() == frozenset()
    assert not mem.report("n2", "b1", 2, NOW + 6, NOW + 6, [])


# -- two consecutive judgements -----------------------------------------------------------
def test_a_hang_counts_when_two_consecutive_passes_judge_it() -> None:
    mem = HangMemory()
    assert mem.confirm([hang()], {}) == []
    assert mem.confirm([hang()], {}) == [hang()]
    assert mem.confirm([hang()], {}) == [hang()]  # still hung: still current


def test_a_pass_without_the_hang_forgets_it() -> None:
    mem = HangMemory()
    mem.confirm([hang()], {})
    assert mem.confirm([], {}) == []  # it advanced, went unknown, or ended
    assert mem.confirm([hang()], {}) == []


def test_another_step_or_run_is_another_hang() -> None:
    mem = HangMemory()
    mem.confirm([hang(step=100)], {})
    assert mem.confirm([hang(step=101)], {}) == []  # progress in between
    assert mem.confirm([hang(step=101, restart=1)], {}) == []  # requeued
    assert mem.confirm([hang(step=101, restart=1)], {}) == [hang(step=101, restart=1)]


# -- bounds -------------------------------------------------------------------------------
def test_the_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_module, "MAX_NODES", 3)
    monkeypatch.setattr(memory_module, "MAX_PENDING", 2)
    mem = HangMemory()
    for i in range(5):
        mem.report(f"n{i}", "a", 1, NOW, NOW, [])
    assert [n for n in (f"n{i}" for i in range(5)) if mem.evidence(n, NOW)] == ["n2", "n3", "n4"]
    mem.confirm([hang(job_id=j) for j in (1, 2, 3)], {})
    assert mem.suspects() == {1, 2}


def test_the_site_settings_are_the_memorys() -> None:
    assert HangMemory().cfg == ProgressConfig()
    assert HangMemory(ProgressConfig(hang_min_s=60)).cfg.hang_min_s == 60
