"""Steps under watch: a ``hyperpod step-retry`` helper keeps its step's watch alive
while srun runs; the policy leaves a watched job's fault to the step retry."""

from __future__ import annotations

from ctl_helpers import NOW, cluster, config, fault, faulty, healthy, job, node

from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.snapshot import Snapshot
from hyperpod_agent.controller.store.facade import Store

TTL = 10.0


NODES = ("node1", "node2")


def test_a_watch_lives_while_renewed_and_remembers_when_the_end_was_asked(store: Store) -> None:
    store.start_watch(12, "s1", 1, NODES, NOW - 3600, NOW, TTL)
    assert store.watched_jobs(NOW + 1) == {12: None}
    # told to end: dated by the fault's first report, and said to be new once
    assert store.renew_watch(12, "s1", NOW + 5, TTL, end_at=NOW + 4) == (NOW + 4, True)
    # the first time the end was asked is kept: later renewals do not move it
    assert store.renew_watch(12, "s1", NOW + 8, TTL, end_at=NOW + 7) == (NOW + 4, False)
    assert store.renew_watch(12, "s1", NOW + 8, TTL, end_at=None) == (NOW + 4, False)
    assert store.watched_jobs(NOW + 9) == {12: NOW + 4}
    assert store.watched_jobs(NOW + 8 + TTL) == {}  # not renewed: gone


def test_a_watch_keeps_what_slurm_said_when_it_began(store: Store) -> None:
    store.start_watch(12, "s1", 1, NODES, NOW - 3600, NOW, TTL)
    row = store.step_watch(12, "s1")
    assert row is not None
    assert (row.attempt, row.nodes, row.began, row.created_at) == (1, NODES, NOW - 3600, NOW)
    assert row.expires_at == NOW + TTL and row.end_at is None
    # the step's next launch replaces it, told nothing yet
    store.renew_watch(12, "s1", NOW + 1, TTL, end_at=NOW)
    store.start_watch(12, "s1", 2, ("node1", "node5"), NOW - 3600, NOW + 30, TTL)
    row = store.step_watch(12, "s1")
    assert row is not None and (row.attempt, row.nodes, row.end_at) == (2, ("node1", "node5"), None)
    assert store.step_watch(12, "s2") is None
    assert store.renew_watch(12, "s2", NOW, TTL, end_at=None) == (None, False)  # no such watch


def test_a_job_is_watched_while_any_of_its_steps_is_and_unwatched_at_once(store: Store) -> None:
    store.start_watch(12, "s1", 1, NODES, 0.0, NOW, TTL)
    store.start_watch(12, "s2", 1, NODES, 0.0, NOW, TTL)
    store.renew_watch(12, "s2", NOW, TTL, end_at=NOW)
    store.start_watch(13, "s1", 2, NODES, 0.0, NOW, TTL)
    assert store.watched_jobs(NOW) == {12: NOW, 13: None}
    assert store.live_watches(12, NOW) == 2 and store.live_watches(12, NOW + TTL) == 0
    store.unwatch_job(12)
    assert store.watched_jobs(NOW) == {13: None}


XID79 = fault("node2", component="gpu3", code="xid79", action="REBOOT", urgent=True)


def snapshot(watched: dict[int, float | None]) -> Snapshot:
    nodes = cluster(4)
    nodes["node5"] = node("node5", flags=("DRAIN",), reason="hyperpod:spare")
    health = {n: healthy() for n in nodes}
    health["node2"] = faulty()
    return Snapshot(
        nodes=nodes,
        jobs=[job(12, nodes=("node1", "node2"))],
        health=health,
        open_faults=[XID79],
        history=[XID79],
        started_at=NOW - 3600,
        watched_jobs=watched,
    )


def plan(watched: dict[int, float | None]) -> list[tuple[str, str]]:
    d = decide(snapshot(watched), config(), NOW)
    return [(a.kind.value, str(a.node or a.job_id)) for a in d.actions]


def test_a_watched_jobs_fault_is_left_to_the_step_retry() -> None:
    assert ("replace", "node2") in plan({}) and ("requeue", "12") in plan({})
    assert plan({12: None}) == []
    assert plan({12: NOW - 5}) == []  # the step was told to end: its retry is coming


def test_a_watch_that_never_reports_back_stops_protecting_the_job() -> None:
    # told to end a minute ago and still no step retry asked: today's recovery acts
    from hyperpod_agent.controller.snapshot import WATCH_GRACE_S

    late = plan({12: NOW - WATCH_GRACE_S - 1})
    assert ("replace", "node2") in late and ("requeue", "12") in late
