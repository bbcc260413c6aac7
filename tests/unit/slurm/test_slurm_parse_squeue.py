"""squeue --json -> Job, on captured output and on edge cases."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from hyperpod_agent.errors import SlurmError, SlurmParseError
from hyperpod_agent.slurm.models import Job
from hyperpod_agent.slurm.parse import parse_auto_resume, parse_scontrol_jobs, parse_squeue_json

Capture = Callable[[str], str]


def _jobs(text: str) -> dict[int, Job]:
    return {j.job_id: j for j in parse_squeue_json(text)}


def test_running_auto_resume_job_on_two_nodes(capture: Capture) -> None:
    job = _jobs(capture("squeue_a.json"))[3]
    assert (job.name, job.state, job.state_reason) == ("train-ar", "RUNNING", "")
    assert job.nodes == ("node1", "node2")
    assert job.auto_resume == 2
    assert job.admin_comment == "auto_resume=2"
    assert job.requeue and job.batch_host == "node1"
    assert (job.user, job.partition) == ("root", "main")
    assert job.start_time == datetime(2026, 11, 22, 6, 39, 51, tzinfo=UTC)
    # A running job's end_time is only its time limit, and it has no exit code yet.
    assert job.end_time is None and job.exit_code is None


def test_pending_jobs_have_no_times_and_keep_auto_resume(capture: Capture) -> None:
    job = _jobs(capture("squeue_b.json"))[8]
    assert (job.state, job.state_reason, job.nodes) == ("PENDING", "Resources", ())
    assert job.auto_resume == 1
    assert job.start_time is None and job.end_time is None and job.exit_code is None


def test_requeued_job_counts_restarts(capture: Capture) -> None:
    job = _jobs(capture("squeue_a.json"))[4]
    assert (job.state, job.state_reason, job.restart_count) == ("PENDING", "BeginTime", 1)
    assert _jobs(capture("squeue_b.json"))[4].restart_count == 3


def test_failed_cancelled_and_node_fail_jobs(capture: Capture) -> None:
    jobs = _jobs(capture("squeue_b.json"))
    failed, cancelled, node_fail = jobs[5], jobs[7], jobs[9]
    assert (failed.state, failed.state_reason, failed.exit_code) == ("FAILED", "NonZeroExitCode", 3)
    assert failed.end_time == datetime(2026, 11, 22, 6, 41, 11, tzinfo=UTC)
    assert (cancelled.state, cancelled.exit_code) == ("CANCELLED", 0)
    assert cancelled.extra["exit_signal"] == "15"
    assert (node_fail.state, node_fail.state_reason) == ("NODE_FAIL", "NodeDown")
    assert node_fail.requeue is False and node_fail.nodes == ("node4",)


def test_finished_jobs_are_listed_and_nodes_expand(capture: Capture) -> None:
    jobs = _jobs(capture("squeue_b.json"))
    assert sorted(jobs) == list(range(1, 10))
    assert jobs[6].nodes == ("node1", "node2", "node4")
    assert jobs[1].auto_resume is None and jobs[2].auto_resume == 1


def test_slurmctld_unreachable_is_a_slurm_error(capture: Capture) -> None:
    with pytest.raises(SlurmError, match="Failed while looking for jobs"):
        parse_squeue_json(capture("squeue_ctld_down.json"))


@pytest.mark.parametrize("suffix", ["a", "down", "b"])
def test_scontrol_fallback_agrees_with_json(capture: Capture, utc: None, suffix: str) -> None:
    from_json = parse_squeue_json(capture(f"squeue_{suffix}.json"))
    from_text = parse_scontrol_jobs(capture(f"scontrol_jobs_{suffix}.txt"))
    assert [j.job_id for j in from_text] == [j.job_id for j in from_json]
    for text_job, json_job in zip(from_text, from_json, strict=True):
        # Pending reasons differ: scontrol spells them out ("ReqNodeNotAvail,_UnavailableNodes:
        # node4") and the scheduler re-evaluated between the two captures.
        if json_job.state != "PENDING":
            assert text_job.state_reason == json_job.state_reason
        assert replace(text_job, state_reason="") == replace(json_job, state_reason="")


def _doc(*jobs: dict[str, Any]) -> str:
    return json.dumps({"meta": {}, "errors": [], "jobs": list(jobs)})


def test_missing_keys_are_tolerated() -> None:
    (job,) = parse_squeue_json(_doc({"job_id": 7, "job_state": "RUNNING"}))
    assert job == Job(job_id=7, name="", state="RUNNING")


def test_empty_job_list() -> None:
    assert parse_squeue_json(_doc()) == []


def test_newer_slurm_shapes_are_accepted() -> None:
    raw = {
        "job_id": 9,
        "job_state": ["FAILED"],
        "exit_code": {"status": ["EXITED"], "return_code": {"set": True, "number": 233}},
        "end_time": {"set": True, "number": 1795329591},
        "restart_cnt": {"set": True, "number": 2},
    }
    (job,) = parse_squeue_json(_doc(raw))
    assert (job.state, job.exit_code, job.restart_count) == ("FAILED", 233, 2)
    assert job.end_time == datetime.fromtimestamp(1795329591, tz=UTC)


def test_raw_wait_status_is_decoded() -> None:
    (job,) = parse_squeue_json(_doc({"job_id": 1, "job_state": "FAILED", "exit_code": 233 << 8}))
    assert job.exit_code == 233 and "exit_signal" not in job.extra


@pytest.mark.parametrize(
    ("job", "why"),
    [
        ({"job_state": "RUNNING"}, "jobs[0] has no job_id"),
        ({"job_id": "x", "job_state": "RUNNING"}, "jobs[0].job_id is str, expected a number"),
        ({"job_id": 4, "job_state": {"a": 1}}, "job 4.job_state is dict, expected a string"),
        ({"job_id": 4, "job_state": "RUNNING", "nodes": ["n1"]}, "job 4.nodes is list"),
        ({"job_id": 4, "job_state": "RUNNING", "requeue": "yes"}, "job 4.requeue is str"),
        ({"job_id": 4, "job_state": "FAILED", "exit_code": [1]}, "job 4.exit_code is list"),
        ({"job_id": 4}, "job 4 has no job_state"),
        ({"job_id": 4, "job_state": "RUNNING", "nodes": "node[1-"}, "bad node list 'node[1-'"),
    ],
)
def test_malformed_jobs_raise_a_precise_parse_error(job: dict[str, Any], why: str) -> None:
    with pytest.raises(SlurmParseError, match=r"^squeue --json: unexpected output: ") as exc:
        parse_squeue_json(_doc(job))
    assert why in str(exc.value)


@pytest.mark.parametrize(
    ("text", "why"),
    [("", "empty output"), ("not json", "not JSON"), ('{"nodes": []}', "no 'jobs' key")],
)
def test_unexpected_documents(text: str, why: str) -> None:
    with pytest.raises(SlurmParseError, match=why):
        parse_squeue_json(text)


@pytest.mark.parametrize(
    ("comment", "value"),
    [
        ("auto_resume=1", 1),
        ("auto_resume=12", 12),
        ("site=x auto_resume=3", 3),
        ("auto_resume=2;owner=ml", 2),
        ("auto_resume=0", 0),
        ("auto_resume=abc", None),
        ("no_auto_resume=1", None),
        ("auto_resume=1x", None),
        ("", None),
    ],
)
def test_parse_auto_resume(comment: str, value: int | None) -> None:
    assert parse_auto_resume(comment) == value


def test_owner_uid_and_the_nodes_asked_for_by_name(capture: Capture) -> None:
    """What a step retry needs: who owns the job (a caller may only speak for its own
    job) and whether it named its nodes (``-w``: no spare may stand in)."""
    jobs = _jobs(capture("squeue_a.json"))
    assert (jobs[3].user, jobs[3].uid) == ("root", 0)
    assert jobs[3].extra["required_nodes"] == "node[1-2]"
    assert "required_nodes" not in jobs[1].extra
