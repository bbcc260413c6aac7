"""Properties of measured goodput over arbitrary records: any mix of the controller's
event kinds, in any order, with progress records and any job state.

1. The wall time is shared out exactly: productive + every cause's known loss +
   unaccounted == wall, each part >= 0, ETTR within [0, 1]; the cluster's too.
2. Another job's records (its events, its nodes' events, its progress) change nothing
   of a job's answer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from goodput_helpers import T0
from hypothesis import given, settings
from hypothesis import strategies as st

from hyperpod_agent.controller.goodput import (
    ClusterGoodput,
    JobGoodput,
    JobRecord,
    ProgressMark,
    cluster_goodput,
    job_goodput,
)
from hyperpod_agent.controller.goodput.incidents import JOB_POINTS
from hyperpod_agent.controller.store.rows import EventRow

HORIZON = 3000.0
NOW = T0 + HORIZON
KINDS = [
    *JOB_POINTS,
    "fault",
    "fault_cleared",
    "job_ended",
    "step_retry_failed",
    "step_retry_requeue",
    "budget_spent",
]
STATES = ["RUNNING", "PENDING", "COMPLETED", "NODE_FAIL", None]
times = st.floats(0, HORIZON, allow_nan=False)


def message(kind: str, job: int, n: int) -> str:
    if kind == "resumed":
        return f"job {job} resumed from step {n} (restart 1)"
    if kind == "hang":
        return f"job {job} hung: no rank advanced for {n % 500} s past step {n}"
    return f"{kind} {n}"


@st.composite
def records(
    draw: Any, job: int, nodes: tuple[str, ...]
) -> tuple[JobRecord, list[Any], list[ProgressMark]]:
    """A job, raw events (at, kind, node, own, n) and progress marks on ``nodes``."""
    state = draw(st.sampled_from(STATES))
    start = draw(st.none() | times)
    record = JobRecord(
        job,
        state=state,
        started_at=None if start is None else T0 + start,
        ended_at=draw(st.none() | times.map(lambda t: T0 + t)),
        nodes=frozenset(draw(st.lists(st.sampled_from(nodes), max_size=3))),
        node_count=draw(st.integers(0, 8)),
    )
    raw = draw(
        st.lists(
            st.tuples(
                times,
                st.sampled_from(KINDS),
                st.none() | st.sampled_from(nodes),
                st.booleans(),
                st.integers(0, 1000),
            ),
            max_size=30,
        )
    )
    marks = draw(
        st.lists(
            st.builds(
                lambda rank, seen, at, step, paused, reason, since, step_s: ProgressMark(
                    job,
                    rank,
                    T0 + seen,
                    step,
                    T0 + at,
                    paused,
                    reason,
                    since and T0 + since,
                    step_s,
                ),
                st.integers(0, 2),
                times,
                times,
                st.integers(-1, 1000),
                st.booleans(),
                st.sampled_from(["checkpoint save", "evaluation", ""]),
                st.none() | times,
                st.none() | st.floats(0, 20, allow_nan=False),
            ),
            max_size=12,
        )
    )
    return record, raw, marks


def events(raw: list[Any], job: int, first_id: int) -> list[EventRow]:
    return [
        EventRow(
            first_id + i, T0 + at, kind, node, job if own else None, kind, message(kind, job, n)
        )
        for i, (at, kind, node, own, n) in enumerate(raw)
    ]


def shared_out(g: JobGoodput) -> None:
    known = [v.seconds for v in g.lost.values() if v.seconds is not None]
    assert all(s >= -1e-9 for s in known) and g.productive_s >= -1e-9 and g.unaccounted_s >= -1e-9
    assert g.productive_s + sum(known) + g.unaccounted_s == pytest.approx(g.wall_s, abs=1e-6)
    assert g.ettr is None if g.wall_s == 0 else 0.0 <= g.ettr <= 1.0 + 1e-12


def cluster_shared_out(c: ClusterGoodput) -> None:
    known = [v.seconds for v in c.lost_node_s.values() if v.seconds is not None]
    total = c.productive_node_s + sum(known) + c.unaccounted_node_s
    assert total == pytest.approx(c.wall_node_s, abs=1e-6)
    assert c.wall_node_s == pytest.approx(sum(j.wall_s * j.nodes for j in c.jobs))
    assert c.ettr is None if not c.jobs else 0.0 <= c.ettr <= 1.0 + 1e-12


@settings(max_examples=400, deadline=None)
@given(
    mine=records(7, ("n1", "n2", "n3")),
    since=st.none() | times,
)
def test_wall_time_is_shared_out_exactly(mine: Any, since: float | None) -> None:
    job, raw, marks = mine
    g = job_goodput(job, events(raw, 7, 1), marks, NOW, None if since is None else T0 + since)
    shared_out(g)


@settings(max_examples=300, deadline=None)
@given(
    mine=records(7, ("n1", "n2", "n3")),
    other=records(99, ("m1", "m2")),
    since=st.none() | times,
)
def test_another_jobs_records_change_nothing(mine: Any, other: Any, since: float | None) -> None:
    job, raw, marks = mine
    other_job, other_raw, other_marks = other
    when = None if since is None else T0 + since
    alone = job_goodput(job, events(raw, 7, 1), marks, NOW, when)
    mixed = events(raw, 7, 1) + events(other_raw, 99, 1000)
    assert job_goodput(job, mixed, marks + other_marks, NOW, when) == alone
    assert job_goodput(job, mixed[::-1], (marks + other_marks)[::-1], NOW, when) == alone
    both = cluster_goodput([job, other_job], mixed, marks + other_marks, NOW, when)
    cluster_shared_out(both)
    assert [j for j in both.jobs if j.job_id == 7] == ([alone] if alone.wall_s > 0 else [])


def test_the_properties_catch_a_wrong_share() -> None:
    """The check above fails on an answer whose parts do not add up."""
    job = JobRecord(7, state="RUNNING", started_at=T0, node_count=1)
    g = job_goodput(job, [], [], NOW)
    shared_out(g)
    with pytest.raises(AssertionError):
        shared_out(g.model_copy(update={"productive_s": g.productive_s - 1}))
    with pytest.raises(AssertionError):
        shared_out(replace_ettr(g, 1.5))


def replace_ettr(g: JobGoodput, value: float) -> JobGoodput:
    return g.model_copy(update={"ettr": value})


def test_unrelated_records_are_really_ignored_not_dropped_with_the_rest() -> None:
    """The job's own nodes' events count (so the property above says something)."""
    job = JobRecord(7, state="RUNNING", started_at=T0, nodes=frozenset({"n1"}), node_count=1)
    own = [EventRow(1, T0 + 100, "requeue", None, 7, "c", "m")]
    fault = EventRow(2, T0 + 90, "fault", "n1", None, "gpu0 xid79", "m")
    elsewhere = replace(fault, id=3, node="m1")
    assert job_goodput(job, own + [fault], [], NOW) != job_goodput(job, own, [], NOW)
    assert job_goodput(job, own + [elsewhere], [], NOW) == job_goodput(job, own, [], NOW)
