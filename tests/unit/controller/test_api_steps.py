"""``/v1/steps/retry``: the failed step asks, the controller answers and operates."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from test_api import Api, error_of, report

from hyperpod_agent.auth.config import AuthError, Identity
from hyperpod_agent.controller.api.slurm_view import may_ask
from hyperpod_agent.slurm.models import Job

JOB = Job(
    job_id=12,
    name="train",
    state="RUNNING",
    nodes=("node1", "node2", "node3"),
    uid=1000,
    auto_resume=3,  # sbatch --auto-resume=3: the job's own budget
    partition="main",
)
FAILURE = {
    "job_id": 12,
    "step_id": "0",
    "exit_code": 1,
    "nodelist": "node[1-3]",
    "attempt": 1,
    "auto_resume": 3,
}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    for name in ("node1", "node2", "node3"):
        a.slurm.nodes[name] = replace(a.slurm.nodes[name], state="ALLOCATED")
    a.slurm.jobs[12] = replace(JOB, start_time=datetime.fromtimestamp(time.time() - 3600, UTC))
    # the spare vouched for by its agent
    assert a.post("/v1/reports", report("node5", faulty=False), who="node5").status_code == 200
    a.controller.reconcile_once()  # the pass's view: who may ask is checked against it
    yield a
    a.client.close()


def in_slurm(api: Api, **changes: Any) -> None:
    """Job 12 changes in Slurm, and the controller's next pass sees it."""
    api.slurm.jobs[12] = replace(api.slurm.jobs[12], **changes)
    api.controller.reconcile_once()


def faulty(api: Api) -> None:
    assert api.post("/v1/reports", report("node2"), who="node2").status_code == 200


def ask(api: Api, body: dict[str, Any] | None = None, who: str = "node1") -> Any:
    return api.post("/v1/steps/retry", body or FAILURE, who=who)


def test_a_node_fault_gets_a_retry_on_the_spare(api: Api) -> None:
    faulty(api)
    resp = ask(api)
    assert resp.status_code == 202, resp.text
    out = resp.json()
    assert (out["decision"], out["phase"], out["done"], out["attempt"]) == (
        "RETRYSTEP",
        "drain",
        False,
        2,
    )
    assert "gpu0 xid79 on node2: node5 stands in" in out["cause"]
    assert api.controller.wake.is_set()
    api.controller.reconcile_once()  # the leader's pass does the surgery
    done = api.get(f"/v1/steps/retry/{out['id']}", who="node1").json()
    assert (done["decision"], done["phase"], done["done"]) == ("RETRYSTEP", "done", True)
    assert (done["nodelist"], done["nnodes"], done["rdzv_host"]) == ("node[1,3,5]", 3, "node1")
    job = api.slurm.jobs[12]
    assert (job.state, job.restart_count, job.nodes) == ("RUNNING", 0, ("node1", "node3", "node5"))
    # the policy's pass after the surgery neither requeued the job nor touched node2
    assert [c for c in api.slurm.calls if c[0] in ("requeue", "reboot")] == []


def test_asking_again_for_the_same_attempt_gives_the_same_surgery(api: Api) -> None:
    faulty(api)
    first = ask(api).json()
    again = ask(api)
    assert again.status_code == 202 and again.json()["id"] == first["id"]
    assert len(api.store.open_step_retries()) == 1


def test_a_failure_on_healthy_nodes_is_the_applications(api: Api) -> None:
    resp = ask(api)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert (out["decision"], out["id"], out["done"]) == ("FAIL", None, True)
    assert "on healthy nodes node1,node2,node3" in out["cause"]
    assert api.store.events(job_id=12)[-1].kind == "step_retry_fail"


def test_a_job_that_named_its_nodes_falls_back_to_requeue(api: Api) -> None:
    in_slurm(api, extra={"required_nodes": "node[1-3]"})
    faulty(api)
    out = ask(api).json()
    assert (out["decision"], out["done"]) == ("REQUEUE", True)
    assert "named its nodes" in out["cause"]
    assert api.store.open_step_retries() == []
    assert api.store.events(job_id=12)[-1].kind == "step_retry_requeue"


def test_a_surgery_that_fails_answers_requeue_with_the_cause(api: Api) -> None:
    faulty(api)
    api.slurm.fail_next["expand"] = 1
    out = ask(api).json()
    api.controller.reconcile_once()
    got = api.get(f"/v1/steps/retry/{out['id']}", who="node3").json()
    assert (got["decision"], got["phase"], got["done"]) == ("REQUEUE", "failed", True)
    assert "Unable to allocate resources" in got["cause"] and got["nodelist"] == ""


def test_another_steps_surgery_under_way_is_busy(api: Api) -> None:
    faulty(api)
    assert ask(api).status_code == 202
    resp = ask(api, {**FAILURE, "step_id": "1"})
    assert resp.status_code == 409 and error_of(resp)["code"] == "busy"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**FAILURE, "nodelist": "../x"}, "nodelist"),
        ({**FAILURE, "exit_code": 256}, "exit_code"),
        ({**FAILURE, "attempt": 0}, "attempt"),
        ({**FAILURE, "step_id": "0; rm"}, "step_id"),
        ({**FAILURE, "job_id": "twelve"}, "job_id"),
        ({k: v for k, v in FAILURE.items() if k != "attempt"}, "attempt"),
    ],
)
def test_malformed_requests_get_one_line(api: Api, body: dict[str, Any], field: str) -> None:
    resp = ask(api, body)
    err = error_of(resp)
    assert (resp.status_code, err["code"]) == (422, "invalid"), err
    assert err["message"].startswith(field) and "\n" not in err["message"]
    assert api.store.open_step_retries() == []


def test_an_unknown_job_or_surgery_is_404(api: Api) -> None:
    resp = ask(api, {**FAILURE, "job_id": 99}, who="admin")
    message = error_of(resp)["message"]
    assert resp.status_code == 404 and "job 99 is not in the controller's view" in message
    resp = api.get("/v1/steps/retry/77")
    assert resp.status_code == 404 and error_of(resp)["code"] == "not_found"


def test_a_node_may_only_ask_about_a_job_on_it(api: Api) -> None:
    faulty(api)
    resp = ask(api, who="node4")
    assert resp.status_code == 403 and "may only ask about its own job" in error_of(resp)["message"]
    out = ask(api, who="admin").json()
    assert api.get(f"/v1/steps/retry/{out['id']}", who="node4").status_code == 403


def test_a_user_may_only_ask_about_their_own_job() -> None:
    def who(uid: int, node: str | None = None, admin: bool = False) -> Identity:
        return Identity(uid, uid, node, admin, "munge")

    may_ask(who(1000), JOB)
    may_ask(who(0, admin=True), JOB)
    may_ask(who(0, node="node2"), JOB)
    for caller in (who(1001), who(0, node="node4"), who(1000, node="node4")):
        with pytest.raises(AuthError) as err:
            may_ask(caller, JOB)
        assert err.value.status == 403
    with pytest.raises(AuthError):
        may_ask(who(1000), replace(JOB, uid=None))  # an owner Slurm did not name


WATCH = {"job_id": 12, "step_id": "srun-41", "attempt": 1, "nodelist": "node[1-3]"}


def watch(api: Api, body: dict[str, Any] | None = None, who: str = "node1") -> Any:
    return api.post("/v1/steps/watch", body or WATCH, who=who)


def test_a_watched_step_on_healthy_nodes_runs_on(api: Api) -> None:
    api.controller.reconcile_once()  # the pass's view of the job
    resp = watch(api)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"end": False, "cause": "", "renew_every_s": 1.0}
    assert api.store.watched_jobs(api.controller.clock()) == {12: None}


def test_a_node_fault_tells_the_watched_step_to_end_once_and_the_policy_waits(api: Api) -> None:
    api.controller.reconcile_once()
    faulty(api)
    out = watch(api).json()
    assert out["end"] is True and "gpu0 xid79 on node2" in out["cause"]
    assert watch(api).json()["end"] is True
    ends = [e for e in api.store.events(job_id=12) if e.kind == "step_end"]
    assert len(ends) == 1 and "srun-41" in ends[0].message
    # the step will ask for its retry: this pass neither requeues nor replaces
    api.controller.reconcile_once()
    assert [c for c in api.slurm.calls if c[0] in ("requeue", "reboot", "drain")] == []
    # the retry's answer ends the watch (here a FAIL: the application said not to restart)
    assert ask(api, {**FAILURE, "step_id": "srun-41", "exit_code": 93}).json()["done"] is True
    assert api.store.watched_jobs(api.controller.clock()) == {}


def test_after_a_retry_the_new_node_list_is_what_is_watched(api: Api) -> None:
    # The relaunch's watch reads the job from Slurm after the surgery: node2 is out of
    # it, so node2's fault does not end the new launch.
    watch(api)
    faulty(api)
    out = ask(api, {**FAILURE, "step_id": WATCH["step_id"]}).json()
    api.controller.reconcile_once()  # the surgery
    assert api.get(f"/v1/steps/retry/{out['id']}", who="node1").json()["phase"] == "done"
    again = watch(api, {**WATCH, "attempt": 2}, who="node5").json()
    assert again["end"] is False, again
    row = api.store.step_watch(12, "srun-41")
    assert row is not None and row.nodes == ("node1", "node3", "node5")


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({**WATCH, "job_id": 999}, 404),
        ({**WATCH, "step_id": "a b"}, 422),
        ({**WATCH, "nodelist": "node 1"}, 422),
        ({**WATCH, "attempt": 0}, 422),
    ],
)
def test_bad_watches_are_refused(api: Api, body: dict[str, Any], status: int) -> None:
    api.controller.reconcile_once()
    assert watch(api, body).status_code == status


def test_only_the_jobs_own_may_watch_it(api: Api) -> None:
    api.controller.reconcile_once()
    assert watch(api, who="node4").status_code == 403


def test_jobs_show_their_step_retries(api: Api) -> None:
    faulty(api)
    out = ask(api).json()
    api.controller.reconcile_once()  # the surgery
    [row] = [j for j in api.get("/v1/jobs").json() if j["job_id"] == 12]
    assert row["step_retries"] == 1 and row["last_step_retry"]["phase"] == "done"
    detail = api.get("/v1/jobs/12").json()
    [retry] = detail["step_retry_history"]
    assert (retry["id"], retry["decision"], retry["nodelist"]) == (
        out["id"],
        "RETRYSTEP",
        "node[1,3,5]",
    )
    kinds = [e["kind"] for e in detail["events"]]
    assert "step_retry_shrink" in kinds and "step_retry_done" in kinds


def test_a_node_drained_by_us_without_a_fault_does_not_end_the_step(api: Api) -> None:
    # The pass's view may be older than a resume: only faults end a running step.
    api.slurm.nodes["node2"] = replace(
        api.slurm.nodes["node2"], flags=frozenset({"DRAIN"}), reason="hyperpod:drain x"
    )
    api.controller.reconcile_once()
    assert watch(api).json()["end"] is False


@pytest.mark.parametrize("version", ["25.11.7", "26.05.3", "24.11.1", None])
def test_no_expansion_on_a_slurmctld_it_is_not_shown_safe_on(api: Api, version: str | None) -> None:
    """Merging the spare crashes slurmctld 25.11 and 26.05: the job-level requeue
    answers instead, and nothing of the job is touched in place."""
    api.slurm.version = version
    api.controller.gate.expansion.refusal(fresh=True)  # as a pass RECHECK_S later reads it
    status = api.get("/v1/status", who="node1").json()
    assert status["slurmctld_version"] == version
    assert status["expansion_refused"].startswith("job expansion refused")
    faulty(api)
    out = ask(api).json()
    assert out["decision"] == "REQUEUE" and "job expansion refused" in out["cause"], out
    api.controller.reconcile_once()
    assert [c for c in api.slurm.calls if c[0] in ("shrink", "allocate", "absorb")] == []


def test_an_upgrade_between_the_decision_and_the_surgery_stops_it_at_the_gate(api: Api) -> None:
    faulty(api)
    out = ask(api).json()
    assert out["decision"] == "RETRYSTEP", out
    api.slurm.version = "25.11.7"  # slurmctld upgraded before the leader's pass operates
    api.controller.reconcile_once()
    assert [c for c in api.slurm.calls if c[0] in ("shrink", "allocate", "absorb")] == []
    done = api.get(f"/v1/steps/retry/{out['id']}", who="node1").json()
    assert done["done"] and done["decision"] == "REQUEUE", done
    assert api.slurm.jobs[12].nodes == ("node1", "node2", "node3")
