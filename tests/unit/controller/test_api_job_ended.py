"""``POST /v1/jobs/{id}/ended`` and ``resumed_from_step`` through the HTTP API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ctl_helpers import job
from test_api import Api, error_of

from hyperpod_agent.controller.store.rows import TrackedJob


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    a.slurm.jobs[7] = job(7, auto_resume=2)
    a.controller.reconcile_once()
    a.controller.wake.clear()
    yield a
    a.client.close()


@pytest.mark.parametrize(
    ("body", "raw", "message"),
    [
        ({"exit_code": 233, "state": "FAILED"}, None, "job 7 ended (state FAILED, exit 233)"),
        ({}, None, "job 7 ended: reported by"),
        (None, b"", "job 7 ended: reported by"),
        ({"exit_code": None, "state": None}, None, "job 7 ended: reported by"),
    ],
)
def test_job_ended_records_and_wakes(
    api: Api, body: object, raw: bytes | None, message: str
) -> None:
    resp = api.post("/v1/jobs/7/ended", body, who="admin", raw=raw)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"accepted": True, "tracked": True}
    assert api.controller.wake.is_set()
    [event] = [e for e in api.store.events() if e.kind == "job_ended"]
    assert event.message.startswith(message) and event.job_id == 7
    assert "EpilogSlurmctld (admin token)" in event.message


def test_job_ended_of_a_job_not_opted_in(api: Api) -> None:
    api.slurm.jobs[8] = job(8, auto_resume=None)
    api.controller.reconcile_once()
    api.controller.wake.clear()
    resp = api.post("/v1/jobs/8/ended", {}, who="admin")
    assert resp.json() == {"accepted": True, "tracked": False}
    assert not api.controller.wake.is_set()


def test_job_ended_needs_an_admin(api: Api) -> None:
    resp = api.post("/v1/jobs/7/ended", {}, who="node2")
    assert resp.status_code == 403 and error_of(resp)["code"] == "forbidden"
    assert api.post("/v1/jobs/7/ended", {}, who=None).status_code == 401
    assert [e for e in api.store.events() if e.kind == "job_ended"] == []
    assert not api.controller.wake.is_set()


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/jobs/7/ended", {"exit_code": -1}, 422),
        ("/v1/jobs/7/ended", {"exit_code": 256}, 422),
        ("/v1/jobs/7/ended", {"exit_code": "x"}, 422),
        ("/v1/jobs/7/ended", {"state": "FAILED; rm -rf /"}, 422),
        ("/v1/jobs/7/ended", {"state": "F" * 33}, 422),
        ("/v1/jobs/0/ended", {}, 422),
        (f"/v1/jobs/{2**64}/ended", {}, 422),
        ("/v1/jobs/abc/ended", {}, 422),
    ],
)
def test_job_ended_bad_input_is_4xx_without_state_change(
    api: Api, path: str, body: object, status: int
) -> None:
    resp = api.post(path, body, who="admin")
    assert resp.status_code == status, resp.text
    assert error_of(resp)["code"] == "invalid"
    assert [e for e in api.store.events() if e.kind == "job_ended"] == []


def test_job_ended_malformed_json_is_400(api: Api) -> None:
    resp = api.post("/v1/jobs/7/ended", None, who="admin", raw=b"{nope")
    assert resp.status_code == 400 and error_of(resp)["code"] == "malformed_json"


def test_jobs_show_resumed_from_step(api: Api) -> None:
    old = api.store.job(7)
    assert old is not None
    api.store.upsert_job(TrackedJob(7, old.cap, 1, "x", "requeued", 1.0, 0, 1500, 2.0))
    [listed] = api.get("/v1/jobs").json()
    assert listed["resumed_from_step"] == 1500
    assert api.get("/v1/jobs/7").json()["resumed_from_step"] == 1500


def test_slurm_user_may_report_job_ends_and_nobody_else_unprivileged() -> None:
    """EpilogSlurmctld runs as SlurmUser, usually neither root nor in admin_group."""
    import pwd

    from hyperpod_agent.auth.config import Identity
    from hyperpod_agent.controller.api.jobs import is_slurm_user

    nobody = pwd.getpwnam("nobody").pw_uid

    def munge(uid: int) -> Identity:
        return Identity(uid=uid, gid=uid, node=None, is_admin=False, method="munge")

    assert is_slurm_user(munge(nobody), "nobody")
    assert is_slurm_user(munge(nobody), str(nobody))  # SlurmUser given as a uid
    assert not is_slurm_user(munge(nobody), "root")
    assert not is_slurm_user(munge(nobody), "no-such-user-here")
    token = Identity(uid=-1, gid=-1, node=None, is_admin=False, method="token")
    assert not is_slurm_user(token, "nobody")
