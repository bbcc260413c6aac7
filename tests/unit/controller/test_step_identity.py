"""The step routes bind every input a user controls to Slurm's and the job's own records:
the blamed node was the step's when its watch began, the budget is the job's opt-in,
retries are counted per job, a spare comes from the job's partition, an ended job is
neither watched nor retried, and who asks is checked before Slurm is read.

Callers are users by uid (as MUNGE proves them): a test header names the identity.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import FakeSlurm, cluster, config, node

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*httpx2.*")
    from fastapi.testclient import TestClient

from hyperpod_agent.auth.config import AuthConfig, AuthError, Identity
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.controller.api.app import create_app
from hyperpod_agent.controller.api.steps import MAX_WATCHES
from hyperpod_agent.controller.providers.spare_pool import SparePoolProvider
from hyperpod_agent.controller.service import Controller
from hyperpod_agent.controller.snapshot import WATCH_GRACE_S, Snapshot, left_to_step_retry
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.slurm.models import Job

ATTACKER, VICTIM, STRANGER = 1000, 2000, 3000


class Users(ServerAuth):
    """``x-who: admin | node:<name> | uid:<n>``: the identity MUNGE would prove."""

    def __init__(self) -> None:
        super().__init__(AuthConfig(mode="none"))

    def verify(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Identity:
        who = headers.get("x-who", "")
        if who == "admin":
            return Identity(0, 0, None, True, "munge")
        if who.startswith("node:"):
            return Identity(0, 0, who[5:], False, "munge")
        if who.startswith("uid:"):
            uid = int(who[4:])
            return Identity(uid, uid, None, False, "munge")
        raise AuthError("no credential", 401)


class Site:
    """A controller with two users' jobs, a spare, and Slurm's reads counted."""

    def __init__(self, tmp: Path) -> None:
        self.t0 = time.time()
        nodes = {n: replace(x, state="ALLOCATED") for n, x in cluster(4).items()}
        nodes["node5"] = node("node5", flags=("DRAIN",), reason="hyperpod:spare")
        start = datetime.fromtimestamp(self.t0 - 3600, UTC)
        theirs = Job(
            13, "theirs", "RUNNING", nodes=("node3", "node4"), uid=VICTIM, start_time=start
        )
        theirs = replace(theirs, partition="main")
        # the attacker's job opted in with the plain switch (default_attempts: 3)
        mine = replace(theirs, job_id=12, name="train", nodes=("node1", "node2"), uid=ATTACKER)
        mine = replace(mine, auto_resume=1)
        self.slurm = FakeSlurm(nodes, [mine, theirs])
        self.store = Store(tmp / "s.db")
        self.controller = Controller(
            config(auth={"mode": "none"}), self.store, self.slurm, SparePoolProvider(self.slurm)
        )
        self.client = TestClient(create_app(self.controller, Users()))
        self.reads: list[str] = []
        list_nodes, list_jobs = self.slurm.list_nodes, self.slurm.list_jobs

        def counted_nodes() -> Any:
            self.reads.append("sinfo")
            return list_nodes()

        def counted_jobs() -> Any:
            self.reads.append("squeue")
            return list_jobs()

        self.slurm.list_nodes = counted_nodes  # type: ignore[method-assign]
        self.slurm.list_jobs = counted_jobs  # type: ignore[method-assign]
        for name in ("node1", "node2", "node3", "node4", "node5"):
            self.report(name, faulty=False)
        self.passes()

    def later(self, seconds: float) -> None:
        """The controller's clock moves on (past a shared Slurm read, for one)."""
        self.controller.clock = lambda: time.time() + seconds

    def passes(self) -> None:
        """One reconcile pass (its own Slurm reads are not the routes')."""
        self.controller.reconcile_once()
        self.reads.clear()

    def post(self, path: str, body: Any, who: str) -> Any:
        headers = {"content-type": "application/json", "x-who": who}
        return self.client.post(path, content=json.dumps(body).encode(), headers=headers)

    def get(self, path: str, who: str) -> Any:
        return self.client.get(path, headers={"x-who": who})

    def report(self, name: str, faulty: bool = True) -> None:
        """The node's agent reports it: healthy, or with an urgent XID 79."""
        now = datetime.now(UTC).isoformat()
        finding = {
            "component": "gpu0",
            "code": "xid79",
            "status": "FAIL",
            "action": "REBOOT",
            "urgent": True,
            "message": "GPU has fallen off the bus",
        }
        findings = [finding] if faulty else []
        confirmed = [{"probe": "gpu", "component": "gpu0", "code": "xid79"}] * len(findings)
        result = {"probe": "gpu", "status": "FAIL" if faulty else "OK", "at": now}
        body = {
            "node": name,
            "agent_id": "a",
            "seq": int(time.time() * 1e6),
            "generated_at": now,
            "verdict": "faulty" if faulty else "healthy",
            "confirmed": confirmed,
            "results": [{**result, "findings": findings}],
        }
        resp = self.post("/v1/reports", body, f"node:{name}")
        assert resp.status_code == 200, resp.text

    def retry(self, who: str = f"uid:{ATTACKER}", **over: Any) -> Any:
        # what the helper sends (older controllers read nodelist and auto_resume)
        body = {"job_id": 12, "step_id": "srun-1", "exit_code": 1, "attempt": 1}
        body = {**body, "nodelist": "node[1-2]", "auto_resume": 0, **over}
        return self.post("/v1/steps/retry", body, who)

    def watch(self, who: str = f"uid:{ATTACKER}", **over: Any) -> Any:
        body = {"job_id": 12, "step_id": "srun-1", "attempt": 1, "nodelist": "node[1-2]", **over}
        return self.post("/v1/steps/watch", body, who)

    def changes(self) -> list[tuple[object, ...]]:
        return [c for c in self.slurm.calls if c[0] not in ("show",)]


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    s = Site(tmp_path)
    yield s
    s.client.close()


def code(resp: Any) -> tuple[int, str]:
    return resp.status_code, resp.json()["error"]["code"]


# -- the blamed node ------------------------------------------------------------------
def test_a_node_that_was_never_the_jobs_is_not_blamed(site: Site) -> None:
    site.report("node3")  # the other user's node has an urgent fault
    resp = site.retry(nodelist="node3", auto_resume=1000)
    out = resp.json()
    assert (resp.status_code, out["decision"]) == (200, "FAIL"), out
    assert "on healthy nodes node1,node2" in out["cause"]
    assert site.store.open_step_retries() == [] and site.changes() == []


def test_the_nodes_recorded_when_the_watch_began_are_the_steps(site: Site) -> None:
    assert site.watch(nodelist="node3").json()["end"] is False
    [row] = [site.store.step_watch(12, "srun-1")]
    assert row is not None and row.nodes == ("node1", "node2")  # Slurm's, not the helper's
    # Slurm released node2 (sbatch --no-kill): it was the step's, it is still blamed
    # (dead: the job-level requeue mends it, Slurm keeping its part of the step)
    site.slurm.jobs[12] = replace(site.slurm.jobs[12], nodes=("node1",))
    site.slurm.nodes["node2"] = replace(
        site.slurm.nodes["node2"], state="DOWN", flags=frozenset({"NOT_RESPONDING"})
    )
    site.later(2.0)
    out = site.retry(nodelist="node9").json()
    assert out["decision"] == "REQUEUE" and "node2 not responding" in out["cause"], out


def test_a_recorded_node_another_job_holds_now_is_not_blamed(site: Site) -> None:
    site.watch()
    # node2 left job 12 and went to the other user's job, where it has a fault
    site.slurm.jobs[12] = replace(site.slurm.jobs[12], nodes=("node1",))
    site.slurm.jobs[13] = replace(site.slurm.jobs[13], nodes=("node2", "node3", "node4"))
    site.report("node2")
    site.later(2.0)
    out = site.retry(nodelist="node[1-2]").json()
    assert out["decision"] == "FAIL" and "healthy nodes node1" in out["cause"], out
    assert [c for c in site.slurm.calls if c[0] == "drain"] == []


# -- the budget -----------------------------------------------------------------------
def test_the_budget_is_the_jobs_opt_in_not_the_requests(site: Site) -> None:
    site.slurm.jobs[12] = replace(site.slurm.jobs[12], auto_resume=None)
    site.passes()
    site.report("node2")
    out = site.retry(auto_resume=1000).json()
    assert out["decision"] == "FAIL" and "did not opt in" in out["cause"], out
    assert site.store.open_step_retries() == []


def done_retry(site: Site, step_id: str, attempt: int = 1) -> None:
    plan = {"bad_node": "node9", "spare": "node5", "reason": "r", "keep": [], "cause": "c"}
    event = EventIn("step_retry_planned", "planned", None, 12, "test")
    run_id, _ = site.store.add_step_retry(12, step_id, attempt, 3, plan, "test", site.t0, event)
    site.store.set_step_phase(run_id, "done", site.t0, outcome="RETRYSTEP")


def test_retries_are_counted_per_job_whatever_the_step_is_called(site: Site) -> None:
    for step in ("srun-a", "srun-b", "srun-c"):  # the plain switch: default_attempts, 3
        done_retry(site, step)
    site.report("node2")
    out = site.retry(step_id="srun-d", auto_resume=1000).json()
    assert out["decision"] == "REQUEUE" and "in-place budget spent (3/3)" in out["cause"], out


# -- an ended job ---------------------------------------------------------------------
def test_an_ended_job_is_neither_watched_nor_retried_and_slurm_is_not_read(site: Site) -> None:
    site.slurm.jobs[12] = replace(site.slurm.jobs[12], state="COMPLETED")
    site.passes()
    day_ahead = datetime.fromtimestamp(site.t0 + 86400, UTC).isoformat()
    assert code(site.watch(started_at=day_ahead)) == (404, "not_found")
    resp = site.retry()
    assert code(resp) == (404, "not_found") and "COMPLETED" in resp.json()["error"]["message"]
    assert site.reads == []
    assert site.store.watched_jobs(time.time()) == {}


def test_a_job_requeued_since_the_last_pass_is_neither_watched_nor_retried(site: Site) -> None:
    assert site.watch().status_code == 200
    site.slurm.jobs[12] = replace(site.slurm.jobs[12], state="PENDING", nodes=())
    site.later(2.0)  # Slurm read anew, before the next pass
    site.report("node2")
    resp = site.retry()
    assert code(resp) == (404, "not_found") and "PENDING" in resp.json()["error"]["message"]
    assert code(site.watch(step_id="srun-2")) == (404, "not_found")
    assert site.store.watched_jobs(time.time()) == {} and site.store.open_step_retries() == []


def test_a_watch_does_not_outlive_its_job(site: Site) -> None:
    assert site.watch().status_code == 200
    site.slurm.jobs[12] = replace(site.slurm.jobs[12], state="COMPLETED")
    site.passes()
    assert code(site.watch()) == (404, "not_found")
    assert site.store.watched_jobs(time.time()) == {}


# -- who asks -------------------------------------------------------------------------
@pytest.mark.parametrize("who", [f"uid:{VICTIM}", f"uid:{STRANGER}", "node:node3"])
def test_only_the_owner_may_ask_and_slurm_is_not_read_for_anyone_else(site: Site, who: str) -> None:
    site.report("node2")
    assert code(site.retry(who=who)) == (403, "forbidden")
    assert code(site.watch(who=who)) == (403, "forbidden")
    assert site.reads == [] and site.store.open_step_retries() == []


def test_an_unknown_job_is_refused_without_reading_slurm(site: Site) -> None:
    assert code(site.retry(job_id=99)) == (404, "not_found")
    assert code(site.watch(job_id=99)) == (404, "not_found")
    assert site.reads == []


def test_who_asks_is_checked_before_the_body_is_validated(site: Site) -> None:
    refused = [
        site.retry(who=f"uid:{STRANGER}", exit_code="x"),
        site.watch(who=f"uid:{STRANGER}", attempt=0),
        site.post("/v1/nodes/node1/actions", {"action": "explode"}, "node:node1"),
        site.post("/v1/checks", {"nodes": "node1"}, f"uid:{ATTACKER}"),
        site.post("/v1/jobs/12/ended", {"exit_code": "x"}, f"uid:{ATTACKER}"),
        site.post("/v1/reports", {"node": "node3", "seq": "x"}, "node:node2"),
        site.post("/v1/heartbeats", {"node": "node3"}, f"uid:{ATTACKER}"),
    ]
    assert [code(r) for r in refused] == [(403, "forbidden")] * len(refused)


def test_owner_polls_a_surgery_after_the_job_left_the_view_others_are_refused(
    site: Site,
) -> None:
    site.report("node2")
    out = site.retry().json()
    assert out["decision"] == "RETRYSTEP", out
    site.reads.clear()
    assert code(site.get(f"/v1/steps/retry/{out['id']}", f"uid:{STRANGER}")) == (
        403,
        "forbidden",
    )
    site.controller.jobs = []  # Slurm forgot the job (MinJobAge)
    assert code(site.get(f"/v1/steps/retry/{out['id']}", f"uid:{STRANGER}")) == (
        403,
        "forbidden",
    )
    assert site.get(f"/v1/steps/retry/{out['id']}", f"uid:{ATTACKER}").status_code == 200
    assert site.reads == []


# -- the watch ------------------------------------------------------------------------
def test_the_watch_ignores_the_helpers_start_and_node_list(site: Site) -> None:
    site.report("node2")
    day_ahead = datetime.fromtimestamp(site.t0 + 86400, UTC).isoformat()
    out = site.watch(started_at=day_ahead, nodelist="node1").json()
    assert out["end"] is True and "xid79 on node2" in out["cause"], out


def test_a_fault_older_than_the_job_does_not_end_its_step(site: Site) -> None:
    site.report("node2")
    later = datetime.fromtimestamp(time.time() + 5, UTC)
    site.slurm.jobs[12] = replace(site.slurm.jobs[12], start_time=later)
    site.later(2.0)  # the watch reads Slurm anew (no pass: it would act on the fault)
    assert site.watch().json()["end"] is False


def test_watching_anew_does_not_extend_the_grace_a_fault_gives(site: Site) -> None:
    site.report("node2")
    reported = time.time()
    assert site.watch().json()["end"] is True
    later = reported + WATCH_GRACE_S + 30
    site.controller.clock = lambda: later
    for i in range(3):  # new steps, new launches: none is a fresh grace
        assert site.watch(step_id=f"srun-{i + 2}", attempt=i + 1).json()["end"] is True
    watched = site.store.watched_jobs(later)
    assert watched[12] is not None and watched[12] <= reported
    snap = Snapshot(nodes={}, jobs=[], watched_jobs=watched)
    assert 12 not in left_to_step_retry(snap, later)


def test_a_job_cannot_hold_more_than_max_watches(site: Site) -> None:
    for i in range(MAX_WATCHES):
        assert site.watch(step_id=f"s{i}").status_code == 200
    assert code(site.watch(step_id="one-more")) == (409, "busy")
    assert site.watch(step_id="s0").status_code == 200  # a renewal still is


# -- the cost of asking ---------------------------------------------------------------
def test_many_asks_share_one_slurm_read(site: Site) -> None:
    for attempt in range(1, 31):
        assert site.retry(attempt=attempt).json()["decision"] == "FAIL"
    for i in range(10):
        assert site.watch(step_id=f"s{i}").status_code == 200
    # one read serves a second, whoever asks (the test runs in about one)
    assert site.reads.count("squeue") <= 3 and site.reads.count("sinfo") <= 3, site.reads
