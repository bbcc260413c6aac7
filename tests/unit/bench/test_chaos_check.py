"""The chaos campaign's checker: its parsers on captured Slurm output and literal text, and
each invariant both catching a violation in a small hand-built scenario and passing a clean
one (a check that cannot fail proves nothing)."""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.chaos_check import (
    Evidence,
    Limits,
    check_campaign,
    percentile,
    summarize,
)
from bench.chaos_evidence import (
    AdminAction,
    CtldAction,
    Event,
    EvidenceError,
    Injection,
    JobSample,
    NodeSample,
    ProcessSample,
    Recovery,
    Reservation,
    ReservationSweep,
    StatusSample,
    Violation,
)
from bench.chaos_parse import (
    ctld_actions,
    parse_ctld_log,
    parse_events,
    parse_jobs,
    parse_kv,
    parse_nodes,
    parse_reservations,
    parse_train_output,
    status_sample,
)
from bench.chaos_records_checks import (
    actions_logged,
    one_leader,
    reconcile_liveness,
)
from bench.chaos_state_checks import (
    admin_untouched,
    auto_resume_outcomes,
    blast_radius,
    left_behind,
    training_outputs,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def node(t: float, name: str, state: str = "IDLE", reason: str = "") -> NodeSample:
    base, *flags = state.split("+")
    return NodeSample(t, name, base, frozenset(flags), reason)


def job(
    t: float, job_id: int, state: str = "RUNNING", restarts: int = 0, name: str = "train"
) -> JobSample:
    return JobSample(t, job_id, name, state, restarts, ("node1", "node2"), "0:0")


def event(
    id: int,
    at: float,
    kind: str,
    node: str | None = None,
    job_id: int | None = None,
    message: str = "",
) -> Event:
    return Event(id, at, kind, node, job_id, "cause", message or f"{kind} {node or job_id}")


def invariants(found: list[Violation]) -> list[str]:
    return [v.invariant for v in found]


# -- parsers ------------------------------------------------------------------------------
def test_nodes_parse_from_a_real_capture() -> None:
    nodes = {n.node: n for n in parse_nodes(5.0, (FIXTURES / "scontrol_nodes_b.txt").read_text())}
    assert nodes["node1"].state == "MIXED"
    assert nodes["node1"].flags == {"DRAIN", "REBOOT_REQUESTED"}
    assert nodes["node1"].reason == "hyperpod:reboot xid79 test"
    assert nodes["node1"].reason_user == "root"
    # a reason holding "; key=value a=b" stays whole
    assert (
        nodes["node3"].reason
        == "hyperpod:replace gpu3 xid79 GPU has fallen off the bus; key=value a=b"
    )
    assert [n for n, s in nodes.items() if s.out] == ["node1", "node2", "node3", "node4", "node5"]
    assert [n for n, s in nodes.items() if s.ours] == ["node1", "node3", "node5"]
    assert [n for n, s in nodes.items() if s.spare] == ["node5"]
    assert {s.t for s in nodes.values()} == {5.0}


def test_nodes_in_service_and_empty_and_broken_output() -> None:
    (n,) = parse_nodes(1.0, "NodeName=a1 State=ALLOCATED Partitions=main Reason=")
    assert (n.state, n.flags, n.out, n.ours, n.reason) == (
        "ALLOCATED",
        frozenset(),
        False,
        False,
        "",
    )
    assert parse_nodes(1.0, "No nodes in the system\n") == []
    with pytest.raises(EvidenceError):
        parse_nodes(1.0, "slurm_load_node error: Unable to contact slurm controller")


def test_jobs_parse_from_real_captures_with_restarts() -> None:
    jobs = {j.job_id: j for j in parse_jobs(9.0, (FIXTURES / "scontrol_jobs_b.txt").read_text())}
    assert (jobs[4].state, jobs[4].restarts, jobs[4].nodes) == ("PENDING", 3, ())
    assert jobs[6].name == "wide job"
    assert jobs[6].nodes == ("node1", "node2", "node4")
    assert jobs[5].exit_code == "3:0" and jobs[5].ended
    assert not jobs[3].ended


def test_kv_keeps_free_text_whole_and_refuses_no_pairs() -> None:
    kv = parse_kv("JobId=3 JobName=my job X=1 UserId=root(0) Comment=a=b Foo=x StdErr=/o")
    assert kv["JobName"] == "my job X=1"
    assert kv["Comment"] == "a=b Foo=x"
    assert kv["StdErr"] == "/o"
    with pytest.raises(EvidenceError):
        parse_kv("nothing here")


def test_reservations_parse_and_none() -> None:
    line = (
        "ReservationName=hyperpod-check-3-1700000000 StartTime=2026-11-28T09:00:00 "
        "EndTime=2026-11-28T10:00:00 Duration=01:00:00 Nodes=node[3-4] NodeCnt=2 CoreCnt=4 "
        "Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES TRES=cpu=4 Users=root "
        "Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a"
    )
    sweep = parse_reservations(3.0, line)
    assert sweep.reservations == (
        Reservation("hyperpod-check-3-1700000000", ("node3", "node4"), "MAINT,SPEC_NODES", "root"),
    )
    assert parse_reservations(4.0, "No reservations in the system").reservations == ()


CTLD = """\
[2026-11-28T09:41:27.123] update_node: node node2 reason set to: hyperpod:drain gpu0 xid79 lost
[2026-11-28T09:41:27.124] update_node: node node2 state set to DRAINING
  a continuation line without a time
[2026-11-28T09:41:30.000] reboot request queued for nodes node[3-4]
[2026-11-28T09:41:31.000] _job_complete: requeue JobId=12 due to node failure
[2026-11-28T09:41:32.500] Requeuing JobId=13
[2026-11-28T09:41:33.000] sched: Allocate JobId=14 NodeList=node1 #CPUs=1 Partition=main
"""


def test_ctld_log_lines_and_actions() -> None:
    lines = parse_ctld_log(CTLD, tz=UTC)
    assert len(lines) == 6
    assert lines[0].t == pytest.approx(1795858887.123)
    got = [(a.verb, a.target, a.detail) for a in ctld_actions(lines)]
    assert got == [
        ("reason", "node2", "hyperpod:drain gpu0 xid79 lost"),
        ("state", "node2", "DRAINING"),
        ("reboot", "node3", ""),
        ("reboot", "node4", ""),
        ("slurm_requeue", "12", ""),
        ("requeue", "13", ""),
    ]


def test_events_and_status_parse() -> None:
    rows = [
        {
            "id": 2,
            "at": "2026-11-28T09:41:28Z",
            "kind": "drain",
            "node": "node2",
            "job_id": None,
            "cause": "xid79",
            "message": "drain node2 reason='hyperpod:drain ...'",
        },
        {
            "id": 1,
            "at": "2026-11-28T09:41:27.500000+00:00",
            "kind": "requeue",
            "node": None,
            "job_id": 12,
            "cause": "c",
            "message": "requeue job 12",
        },
    ]
    events = parse_events(json.dumps(rows))
    assert [e.id for e in events] == [1, 2]
    assert events[0].at == pytest.approx(1795858887.5) and events[0].job_id == 12
    assert events[1].names_node("node2") and not events[1].names_node("node")
    with pytest.raises(EvidenceError):
        parse_events('[{"id": 1}]')
    s = status_sample(10.0, {"leader": "ctl-a", "last_pass_at": "2026-11-28T09:41:27Z"})
    assert s == StatusSample(10.0, "ctl-a", 1795858887.0)
    none = status_sample(11.0, {"leader": None, "last_pass_at": None})
    assert none is not None and none.last_pass_at is None
    # a standby's own last pass (never) is not the leader's: such an answer is no sample
    standby = {"leader": "ctl-a", "this_controller": "ctl-b", "last_pass_at": None}
    assert status_sample(12.0, standby) is None
    mine = {"leader": "ctl-a", "this_controller": "ctl-a", "last_pass_at": None}
    assert status_sample(13.0, mine) == StatusSample(13.0, "ctl-a", None)


def test_event_names_a_node_or_job_as_a_whole_word() -> None:
    e = event(1, 0.0, "replace", "node1", None, "replace node1 with spare node12 (job 7)")
    assert e.names_node("node1") and e.names_node("node12")
    assert not e.names_node("node2")
    assert e.names_job(7) and not e.names_job(71)


TRAIN = """\
batch script started on node[1-2] at 99.0
attempt 1 on node[1-2] at 100.0
fresh start at=100.5
step=1 loss=0.1 at=101.0
step=2 loss=0.1 at=102.0
step=3 loss=0.1 at=103.0
attempt 2 on node[1,3] at 110.0 rendezvous node1
resume step=2 restarts=1 at=111.0
step=3 loss=0.1 at=112.0
step=4 loss=0.1 at=113.0
done step=4 at=113.5
"""


def test_train_output_parses_attempts() -> None:
    out = parse_train_output(TRAIN)
    one, two = out.attempts
    assert (one.number, one.nodes, one.started_at, one.start_step) == (1, "node[1-2]", 100.0, 0)
    assert one.steps == ((1, 101.0), (2, 102.0), (3, 103.0)) and one.last_at == 103.0
    assert (two.number, two.start_step, two.last_at) == (2, 2, 113.5)
    assert out.done_step == 4


# -- 1 admin -------------------------------------------------------------------------------
ADMIN_DRAIN = AdminAction("drain", "node2", start=100.0, end=200.0, reason="maintenance")


def test_admin_drain_kept_passes() -> None:
    samples = [
        node(90, "node2"),
        node(110, "node2", "IDLE+DRAIN", "maintenance"),
        node(150, "node2", "DOWN+DRAIN+NOT_RESPONDING", "maintenance"),
        node(210, "node2", "IDLE+DRAIN", "hyperpod:drain gpu0 xid79"),  # after the admin's end
    ]
    assert admin_untouched(samples, [ADMIN_DRAIN]) == []


def test_admin_drain_taken_over_by_the_product_is_caught() -> None:
    samples = [
        node(110, "node2", "IDLE+DRAIN", "maintenance"),
        node(150, "node2", "IDLE+DRAIN", "hyperpod:drain gpu0 xid79"),
    ]
    (v,) = admin_untouched(samples, [ADMIN_DRAIN])
    assert v.when == 150 and "a product reason" in v.evidence and "hyperpod:drain" in v.evidence


def test_admin_drain_resumed_early_is_caught() -> None:
    samples = [node(110, "node2", "IDLE+DRAIN", "maintenance"), node(150, "node2", "IDLE")]
    (v,) = admin_untouched(samples, [ADMIN_DRAIN])
    assert "back in service" in v.evidence and "until" in v.evidence


def test_admin_resume_then_product_drain_is_caught() -> None:
    resume = AdminAction("resume", "node4", start=100.0, end=300.0)
    samples = [node(150, "node4"), node(160, "node4", "IDLE+DRAIN", "hyperpod:hold gpu0 lemon")]
    assert invariants(admin_untouched(samples, [resume])) == ["admin_untouched"]
    assert admin_untouched(samples[:1], [resume]) == []


def test_admin_reservation_gone_or_moved_is_caught() -> None:
    reserve = AdminAction("reserve", "node3", start=100.0, end=200.0, reservation="site-maint")
    kept = ReservationSweep(110, (Reservation("site-maint", ("node3",)),))
    samples = [node(110, "node3", "IDLE+MAINTENANCE+RESERVED")]
    assert admin_untouched(samples, [reserve], [kept, ReservationSweep(210, ())]) == []
    (gone,) = admin_untouched(samples, [reserve], [kept, ReservationSweep(150, ())])
    assert "'site-maint' gone" in gone.evidence
    moved = ReservationSweep(150, (Reservation("site-maint", ("node3", "node4")),))
    (v,) = admin_untouched(samples, [reserve], [kept, moved])
    assert "now on ['node3', 'node4']" in v.evidence


# -- 2 blast radius -----------------------------------------------------------------------
def sweep(t: float, *out: str, size: int = 6) -> list[NodeSample]:
    """node1..node<size>; those in ``out`` drained with a product reason."""
    names = [f"node{i}" for i in range(1, size + 1)]
    return [
        node(t, n, "IDLE+DRAIN", "hyperpod:drain gpu0 x") if n in out else node(t, n) for n in names
    ]


def test_blast_radius_within_the_limit_passes() -> None:
    samples = [
        *sweep(10, "node1"),
        node(20, "node1", "IDLE+DRAIN", "hyperpod:reboot gpu0 xid79"),
        node(20, "node2", "IDLE+DRAIN", "hyperpod:spare"),  # the pool: not counted
        node(20, "node3", "IDLE+DRAIN", "maintenance"),  # an admin's: not counted
        node(20, "node4", "DOWN+NOT_RESPONDING", "Not responding"),  # Slurm's: not counted
    ]
    assert blast_radius(samples, max_out=1) == []


def test_blast_radius_over_the_limit_is_one_violation_per_run() -> None:
    samples = [
        *sweep(10, "node1"),
        *sweep(20, "node1", "node4"),
        *sweep(30, "node1", "node4", "node5"),
        *sweep(40, "node4"),
        *sweep(50, "node2", "node3"),
    ]
    first, second = blast_radius(samples, max_out=1)
    assert first.when == 20 and "3 nodes" in first.evidence and "(2 sweeps)" in first.evidence
    assert "node5 IDLE+DRAIN" in first.evidence
    assert second.when == 50


def test_blast_radius_leaves_the_admins_nodes_out() -> None:
    samples = sweep(20, "node1", "node2")
    held = [AdminAction("drain", "node2", start=10.0, reason="maint")]
    assert blast_radius(samples, max_out=1, admin=held) == []
    assert len(blast_radius(samples, max_out=1)) == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=20),
    st.integers(min_value=0, max_value=4),
)
def test_blast_radius_counts_each_run_over_the_limit(counts: list[int], max_out: int) -> None:
    samples = [
        s for t, k in enumerate(counts) for s in sweep(t, *[f"node{i + 1}" for i in range(k)])
    ]
    over = [k > max_out for k in counts]
    runs = sum(1 for i, o in enumerate(over) if o and (i == 0 or not over[i - 1]))
    assert len(blast_radius(samples, max_out)) == runs


# -- 3 training outputs ----------------------------------------------------------------------
def test_clean_training_output_passes() -> None:
    assert training_outputs({7: parse_train_output(TRAIN)}, ckpt_every=2) == []


def test_two_attempts_at_once_are_caught() -> None:
    text = TRAIN.replace("step=3 loss=0.1 at=103.0", "step=3 loss=0.1 at=110.5")
    (v,) = training_outputs({7: parse_train_output(text)}, ckpt_every=2)
    assert "still ran" in v.evidence and "0.500 s later" in v.evidence


def test_interleaved_copies_are_caught() -> None:
    text = TRAIN.replace(
        "step=4 loss=0.1 at=113.0", "step=3 loss=0.1 at=112.5\nstep=4 loss=0.1 at=113.0"
    )
    (v,) = training_outputs({7: parse_train_output(text)}, ckpt_every=2)
    assert "step 3" in v.evidence and "step 4 was due" in v.evidence


def test_resume_too_far_back_is_caught() -> None:
    text = TRAIN.replace("resume step=2 restarts=1", "fresh start")
    text = text.replace(
        "step=3 loss=0.1 at=112.0",
        "step=1 loss=0 at=111.1\nstep=2 loss=0 at=111.2\nstep=3 loss=0.1 at=112.0",
    )
    (v,) = training_outputs({7: parse_train_output(text)}, ckpt_every=2)
    assert "resumed from step 0 but step 3" in v.evidence
    assert training_outputs({7: parse_train_output(text)}, ckpt_every=3) == []


def test_missing_steps_are_caught() -> None:
    text = TRAIN.replace("resume step=2", "resume step=3").replace("step=3 loss=0.1 at=112.0\n", "")
    text = text.replace("step=3 loss=0.1 at=103.0\n", "")
    found = training_outputs({7: parse_train_output(text)}, ckpt_every=5)
    assert invariants(found) == ["training"]
    assert "never printed: 3" in found[0].evidence


def clean_run(steps: int, k: int, fails: list[int]) -> str:
    """A toy trainer's output: each failure after step ``f`` resumes from the newest
    checkpoint (a multiple of ``k``), the attempts one after another."""
    lines, t, start, attempt = [], 0.0, 0, 1
    for stop in [*sorted(set(f for f in fails if 0 < f < steps)), steps]:
        lines.append(f"attempt {attempt} on node[1-2] at {t:.3f}")
        lines.append(
            f"resume step={start} at={t + 0.1:.3f}" if start else f"fresh start at={t + 0.1:.3f}"
        )
        for s in range(start + 1, stop + 1):
            t += 1.0
            lines.append(f"step={s} loss=0.1 at={t:.3f}")
        t += 5.0
        start, attempt = max(start, stop // k * k), attempt + 1
    return "\n".join([*lines, f"done step={steps} at={t:.3f}"])


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=30),
    st.integers(min_value=1, max_value=6),
    st.lists(st.integers(min_value=1, max_value=30), max_size=4),
    st.data(),
)
def test_training_clean_runs_pass_and_a_lost_step_is_caught(
    steps: int, k: int, fails: list[int], data: st.DataObject
) -> None:
    text = clean_run(steps, k, fails)
    assert training_outputs({1: parse_train_output(text)}, ckpt_every=k) == []
    lines = text.splitlines()
    once = [
        i
        for i, ln in enumerate(lines)
        if ln.startswith("step=") and sum(x.split(" ")[0] == ln.split(" ")[0] for x in lines) == 1
    ]
    drop = data.draw(st.sampled_from(once))
    broken = "\n".join(ln for i, ln in enumerate(lines) if i != drop)
    found = training_outputs({1: parse_train_output(broken)}, ckpt_every=k)
    assert any("never printed" in v.evidence for v in found)


# -- 4 auto-resume outcomes -----------------------------------------------------------------
def test_auto_resume_jobs_completed_or_explained_pass() -> None:
    jobs = [job(10, 5), job(50, 5, "COMPLETED"), job(50, 6, "FAILED", 3), job(50, 7, "CANCELLED")]
    events = [event(1, 40, "budget_spent", job_id=6)]
    assert auto_resume_outcomes(jobs, {5, 6, 7}, events, excused={7}) == []


def test_auto_resume_jobs_unexplained_are_caught() -> None:
    jobs = [job(50, 6, "FAILED", 1), job(50, 8, "RUNNING")]
    events = [event(1, 40, "requeue", job_id=6), event(2, 41, "budget_spent", job_id=60)]
    found = auto_resume_outcomes(jobs, {6, 8, 9}, events)
    assert [v.evidence.split(" ")[2] for v in found] == ["6", "8", "9"]
    assert "ended FAILED" in found[0].evidence and "1 restarts" in found[0].evidence
    assert "is still RUNNING" in found[1].evidence
    assert "never seen" in found[2].evidence


def test_a_job_left_waiting_for_capacity_is_explained_only_if_slurm_agrees() -> None:
    jobs = [job(50, 6, "FAILED", 1)]  # a 2-node job
    waiting = [
        event(1, 40, "requeue", job_id=6),
        event(2, 45, "requeue_waiting", job_id=6, message="job 6 waits for capacity"),
    ]
    short = [node(60, "node1", "IDLE"), node(60, "node2", "IDLE+DRAIN", "hyperpod:reboot x")]
    roomy = [node(60, "node1", "IDLE"), node(60, "node2", "IDLE")]
    assert auto_resume_outcomes(jobs, {6}, waiting, nodes=short) == []
    assert invariants(auto_resume_outcomes(jobs, {6}, waiting, nodes=roomy)) == [
        "auto_resume_outcome"
    ]
    # the product's last word must be the wait: a later event says something else
    later = [*waiting, event(3, 50, "drain", "node3", job_id=6)]
    assert invariants(auto_resume_outcomes(jobs, {6}, later, nodes=short)) == [
        "auto_resume_outcome"
    ]


# -- 5 left behind -------------------------------------------------------------------------
def test_a_tidy_end_passes() -> None:
    jobs = [
        job(90, 3, "RUNNING", name="hyperpod-expand-3"),
        job(100, 3, "CANCELLED", name="hyperpod-expand-3"),
    ]
    reservations = [
        ReservationSweep(90, (Reservation("hyperpod-expand-3", ("node5",)),)),
        ReservationSweep(100, (Reservation("site", ("node6",)),)),
    ]
    nodes = [
        node(100, "node1", "IDLE+DRAIN", "hyperpod:replace gpu3 xid79"),  # injected
        node(100, "node4", "DOWN+NOT_RESPONDING", "Not responding"),  # not ours
        node(100, "node5", "IDLE+DRAIN", "hyperpod:spare"),
        node(100, "node6", "ALLOCATED"),
    ]
    injections = [Injection(50, "xid79", "node1", heal_at=60)]
    assert left_behind(jobs, reservations, nodes, {"node5", "node6"}, injections) == []


def test_leftovers_are_caught() -> None:
    jobs = [
        job(100, 3, "RUNNING", name="hyperpod-expand-3"),
        job(100, 4, "PENDING", name="hyperpod-check-2-1700000000"),
    ]
    reservations = [
        ReservationSweep(100, (Reservation("hyperpod-check-2-1700000000", ("node3",)),))
    ]
    nodes = [
        node(100, "node5", "IDLE+DRAIN", "hyperpod:check gate after repair"),
        node(100, "node2", "IDLE+DRAIN", "hyperpod:drain agent heartbeat_lost"),
    ]
    found = left_behind(jobs, reservations, nodes, {"node5"}, [])
    text = [v.evidence for v in found]
    assert len(found) == 5
    assert any("job 3 'hyperpod-expand-3' still RUNNING" in x for x in text)
    assert any("job 4" in x and "PENDING" in x for x in text)
    assert any("reservation 'hyperpod-check-2-1700000000'" in x for x in text)
    assert any(x.startswith("spare out of the pool") and "node5" in x for x in text)
    assert any(x.startswith("node left out") and "node2" in x for x in text)


def test_a_node_still_out_long_after_its_fault_healed_is_caught() -> None:
    nodes = [
        node(1000, "node7", "IDLE+DRAIN", "hyperpod:reset gpu0 xid48"),
        node(1000, "node8", "IDLE+DRAIN", "hyperpod:hold gpu0 lemon"),  # for good
        node(1000, "node9", "IDLE+DRAIN", "hyperpod:drain fs /scratch fs_full"),
    ]
    injections = [
        Injection(500, "xid48", "node7", heal_at=600),
        Injection(500, "xid79", "node8", heal_at=600),
        Injection(500, "fs_full", "node9", heal_at=900),  # healed too late to judge
    ]
    (v,) = left_behind([], [], nodes, set(), injections, settle_s=300)
    assert v.evidence.startswith("node7 IDLE+DRAIN") and "400 s after" in v.evidence
    assert left_behind([], [], nodes, set(), injections, settle_s=450) == []
    unhealed = [Injection(500, "xid48", "node7", heal_at=None)]
    assert left_behind([], [], nodes[:1], set(), unhealed, settle_s=0) == []


# -- 6 actions logged ------------------------------------------------------------------------
def test_logged_actions_pass() -> None:
    nodes = [
        node(10, "node1"),
        node(20, "node1", "MIXED+DRAIN", "hyperpod:drain gpu0 xid79"),
        node(30, "node1", "IDLE+DRAIN", "hyperpod:reboot gpu0 xid79"),
        node(40, "node1", "IDLE"),  # Slurm resumed it after the reboot
        node(10, "node5", "IDLE+DRAIN", "hyperpod:spare"),
        node(20, "node5", "ALLOCATED"),
    ]
    jobs = [job(10, 12), job(20, 12, "PENDING", 1), job(30, 12, "RUNNING", 2)]
    # scontrol reboot sets its reason without an update_node line: one line for it
    ctld = [
        CtldAction(15, "reason", "node1", "hyperpod:drain gpu0 xid79"),
        CtldAction(15.9, "reason", "node9", "hyperpod:replace gpu3 xid79"),
        CtldAction(25.1, "reboot", "node1"),
        CtldAction(17, "state", "node5", "IDLE"),
        CtldAction(26, "slurm_requeue", "12"),
    ]
    events = [
        event(1, 15.2, "drain", "node1"),
        event(2, 16, "replace", "node9", 12, "replace node9 with spare node5 (job 12)"),
        event(3, 25.3, "reboot", "node1"),
    ]
    assert actions_logged(nodes, jobs, ctld, events) == []


def test_unlogged_node_changes_are_caught() -> None:
    nodes = [
        node(10, "node1"),
        node(20, "node1", "MIXED+DRAIN", "hyperpod:drain gpu0 xid79"),
        node(30, "node1", "IDLE"),
    ]
    late = [event(1, 45, "drain", "node1")]  # beyond the 10 s window of both changes
    found = actions_logged(nodes, [], [], late)
    assert [v.when for v in found] == [20, 30]
    assert "took 'hyperpod:drain gpu0 xid79'" in found[0].evidence
    # one event explains one change: the drain's does not also explain the resume
    (v,) = actions_logged(nodes, [], [], [event(1, 15, "drain", "node1")])
    assert v.when == 30 and "left 'hyperpod:drain gpu0 xid79' for service" in v.evidence
    both = [event(1, 15, "drain", "node1"), event(2, 29, "resume", "node1")]
    assert actions_logged(nodes, [], [], both) == []
    admin = [AdminAction("resume", "node1", start=28)]  # the admin put it back: not ours
    assert actions_logged(nodes, [], [], [event(1, 15, "drain", "node1")], admin=admin) == []


def test_a_self_drain_while_no_controller_leads_needs_no_event() -> None:
    nodes = [node(10, "node1"), node(20, "node1", "MIXED+DRAIN", "hyperpod:reboot gpu0 xid79")]
    ctld = [CtldAction(15, "reason", "node1", "hyperpod:reboot gpu0 xid79")]
    gone = [ProcessSample(5, "ctl-a", 100, alive=False), ProcessSample(14, "ctl-a", 100, True)]
    assert actions_logged(nodes, [], ctld, [], processes=gone) == []
    leading = [*gone, ProcessSample(14.5, "ctl-a", 100, True, leader_claimed=True)]
    found = actions_logged(nodes, [], ctld, [], processes=leading)
    assert sorted(v.when for v in found) == [15, 20]


def test_unlogged_requeues_from_real_captures_are_caught() -> None:
    before = parse_jobs(100.0, (FIXTURES / "scontrol_jobs_a.txt").read_text())
    after = parse_jobs(130.0, (FIXTURES / "scontrol_jobs_b.txt").read_text())
    jobs = [*before, *after]
    found = actions_logged([], jobs, [], [])
    assert [v.evidence[:20] for v in found] == ["job 4 Restarts 1 -> ", "job 5 Restarts 0 -> "]
    assert "between 1970-01-01T00:01:40.000Z and 1970-01-01T00:02:10.000Z" in found[0].evidence
    requeues = [event(1, 120, "requeue", None, 4), event(2, 121, "requeue", None, 5)]
    assert actions_logged([], jobs, [], requeues) == []
    # Slurm's own requeue for a failed node (logged by slurmctld), the driver's own hit
    slurm = [CtldAction(110, "slurm_requeue", "4")]
    hit = [Injection(125, "kill_job_node", "5")]
    assert actions_logged([], jobs, slurm, [], injections=hit) == []
    assert len(actions_logged([], jobs, slurm, [])) == 1


def test_ctld_changes_without_events_are_caught() -> None:
    ctld = ctld_actions(parse_ctld_log(CTLD, tz=UTC))
    found = actions_logged([], [], ctld, [])
    assert [(v.invariant, v.evidence.split(": ")[1]) for v in found] == [
        ("unlogged_action", "reason of node2 'hyperpod:drain gpu0 xid79 lost'"),
        ("unlogged_action", "reboot of node3 ''"),
        ("unlogged_action", "reboot of node4 ''"),
    ]
    t = ctld[0].t
    events = [event(1, t, "drain", "node2"), event(2, t + 3, "reboot", "node3")]
    admin = [AdminAction("reboot", "node4", start=t + 2.5)]
    assert actions_logged([], [], ctld, events, admin=admin) == []


def test_events_claiming_changes_slurm_never_saw_are_caught() -> None:
    ctld = [CtldAction(10, "reason", "node1", "hyperpod:drain gpu0 x")]
    events = [event(1, 10.5, "drain", "node1"), event(2, 11, "hold", "node2")]
    (v,) = actions_logged([], [], ctld, events)
    assert v.invariant == "unconfirmed_event" and "event 2 hold of node2" in v.evidence


# -- 7 one leader ----------------------------------------------------------------------------
def proc(t: float, cid: str, alive: bool = True, leads: bool | None = True) -> ProcessSample:
    return ProcessSample(t, cid, {"ctl-a": 100, "ctl-b": 200}[cid], alive, leads if alive else None)


LEADS_A = event(1, 0.0, "leader", message="ctl-a leads (lease token 1)")


def test_a_clean_takeover_passes() -> None:
    procs = [
        proc(0, "ctl-a"),
        proc(0, "ctl-b", leads=False),
        proc(10, "ctl-a"),
        proc(10, "ctl-b", leads=False),
        proc(20, "ctl-a", alive=False),
        proc(20, "ctl-b", leads=False),
        proc(30, "ctl-b"),
        proc(40, "ctl-b"),
        proc(40, "ctl-a", alive=False),
    ]
    events = [
        LEADS_A,
        event(2, 5, "drain", "node1"),
        event(3, 22, "leader", message="ctl-b leads (lease token 2)"),
        event(4, 35, "requeue", job_id=12),
    ]
    assert one_leader(procs, events) == []


def test_two_leaders_at_once_are_caught() -> None:
    procs = [proc(0, "ctl-a"), proc(5, "ctl-b"), proc(10, "ctl-a"), proc(15, "ctl-b")]
    found = one_leader(procs, [LEADS_A])
    assert len(found) == 2  # a's firm lead [0, 10] holds b's claim at 5, and b's [5, 15] a's at 10
    assert (
        "ctl-a (pid 100) claimed to lead" in found[0].evidence
        and "ctl-b (pid 200)" in found[0].evidence
    )
    # a lost and took the lease again in between (its takeover recorded): not firm
    retook = event(2, 8, "leader", message="ctl-a leads (lease token 3)")
    assert one_leader(procs[:3], [LEADS_A, retook]) == []


def test_an_action_under_a_dead_leaders_lease_is_caught() -> None:
    procs = [proc(0, "ctl-a"), proc(20, "ctl-a", alive=False), proc(20, "ctl-b", leads=False)]
    (v,) = one_leader(procs, [LEADS_A, event(2, 25, "drain", "node3")])
    assert "event 2 drain of node3" in v.evidence and "dead at" in v.evidence
    # the same controller restarted and recorded its takeover: fine
    again = event(3, 22, "leader", message="ctl-a leads (lease token 2)")
    assert one_leader(procs, [LEADS_A, again, event(2, 25, "drain", "node3")]) == []


# -- 8 reconcile liveness ----------------------------------------------------------------------
def test_a_live_reconcile_loop_passes() -> None:
    status = [StatusSample(t, "ctl-a", t - 4) for t in range(0, 100, 5)]
    status += [
        StatusSample(100, None, None),
        StatusSample(105, "ctl-b", None),
        StatusSample(125, "ctl-b", 120),
    ]
    assert reconcile_liveness(status, interval_s=10) == []


def test_a_stalled_reconcile_loop_is_caught_once_per_stall() -> None:
    status = [StatusSample(t, "ctl-a", min(t, 100)) for t in range(100, 160, 5)]
    status.append(StatusSample(160, "ctl-a", 158))
    (v,) = reconcile_liveness(status, interval_s=10)
    assert v.when == 135 and "no pass for 55.0 s" in v.evidence and "5 samples" in v.evidence


def test_a_new_leader_that_never_passes_is_caught() -> None:
    status = [
        StatusSample(200, "ctl-b", 50),
        StatusSample(225, "ctl-b", 50),
        StatusSample(240, "ctl-b", None),
    ]
    (v,) = reconcile_liveness(status, interval_s=10)
    assert v.when == 240 and "last pass never" in v.evidence
    assert reconcile_liveness([StatusSample(t, None, None) for t in range(0, 100, 10)], 10) == []


# -- all together, and the report ----------------------------------------------------------------
def test_check_campaign_runs_every_invariant_in_time_order() -> None:
    assert check_campaign(Evidence(), Limits(max_out=1)) == []
    ev = Evidence(
        nodes=[*sweep(10, "node1", "node2"), *sweep(20)],
        status=[StatusSample(5, "ctl-a", 5), StatusSample(50, "ctl-a", 5)],
        auto_resume_jobs=frozenset({9}),
    )
    found = check_campaign(ev, Limits(max_out=1, reconcile_interval_s=10))
    assert invariants(found) == [
        "auto_resume_outcome",
        "blast_radius",
        "unlogged_action",
        "unlogged_action",
        "reconcile_stall",
    ]


def test_percentile_is_nearest_rank() -> None:
    assert percentile([3.0], 95) == 3.0
    assert percentile([float(i) for i in range(1, 101)], 50) == 50.0
    assert percentile([float(i) for i in range(1, 101)], 95) == 95.0
    assert percentile([1.0, 2.0, 10.0], 100) == 10.0


def test_summary_reports_faults_recoveries_violations_and_replay() -> None:
    injections = [
        Injection(0, "xid79", "node1"),
        Injection(1, "xid79", "node2"),
        Injection(2, "kill_slurmd", "node3"),
    ]
    recoveries = [
        Recovery("xid79", 0, 10),
        Recovery("xid79", 1, 31),
        Recovery("kill_slurmd", 2, None),
    ]
    violations = [Violation("blast_radius", 1795858887.0, "3 nodes out")]
    text = summarize(injections, recoveries, violations, seed=7, minutes=30, rate=2.5)
    lines = text.splitlines()
    assert lines[0] == "chaos campaign: 3 faults, 1 violations"
    assert (
        "  kill_slurmd                  1" in lines and "  xid79                        2" in lines
    )
    xid = next(ln for ln in lines if ln.startswith("  xid79") and "." in ln)
    assert xid.split() == ["xid79", "2", "0", "10.0", "30.0", "30.0"]
    slurmd = next(ln for ln in lines if ln.startswith("  kill_slurmd") and "-" in ln)
    assert slurmd.split() == ["kill_slurmd", "1", "1", "-", "-", "-"]
    assert "  [blast_radius] 2026-11-28T09:41:27.000Z: 3 nodes out" in lines
    assert lines[-1] == "replay: .venv/bin/python bench/chaos.py --seed 7 --minutes 30 --rate 2.5"


@settings(max_examples=80, deadline=None)
@given(
    st.from_regex(r"node[0-9]{1,3}", fullmatch=True),
    st.sampled_from(["IDLE", "MIXED", "ALLOCATED", "DOWN"]),
    st.sets(st.sampled_from(["DRAIN", "FAIL", "NOT_RESPONDING", "REBOOT_REQUESTED"])),
    st.text(alphabet="abcxyz019 :=;-_/.", max_size=40).map(str.strip),
    st.sampled_from(["", "root", "slurm"]),
)
def test_node_lines_read_back_what_slurm_wrote(
    name: str, state: str, flags: set[str], reason: str, user: str
) -> None:
    shown = "+".join([state, *sorted(flags)])
    tail = f" [{user}@2026-11-28T09:41:27]" if user and reason else ""
    line = (
        f"NodeName={name} Arch=x86_64 CPUAlloc=0 OS=Linux 6.1 #1 SMP RealMemory=1 "
        f"State={shown} Partitions=main BootTime=None Reason={reason}{tail}"
    )
    (n,) = parse_nodes(7.0, line)
    assert (n.node, n.state, n.flags, n.reason) == (name, state, frozenset(flags), reason)
    assert n.reason_user == (user if tail else "")
    assert n.out == (state == "DOWN" or bool(flags & {"DRAIN", "FAIL", "REBOOT_REQUESTED"}))
