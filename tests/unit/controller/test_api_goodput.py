"""``GET /v1/goodput``, ``GET /v1/jobs/{id}/goodput``, the goodput block of
``GET /v1/jobs/{id}`` and the goodput gauges, through the HTTP API with real token
authentication, from what the store and Slurm's view hold."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from goodput_helpers import T0, step_retry
from test_api import Api, error_of

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.api import goodput as goodput_api
from hyperpod_agent.controller.goodput import ClusterGoodput, JobGoodput, Lost
from hyperpod_agent.controller.goodput.records import job_record
from hyperpod_agent.controller.store.rows import TrackedJob
from hyperpod_agent.health import JobProgress, RankProgress
from hyperpod_agent.slurm.models import Job

NOW = T0 + 1000


def iso(t: float) -> str:
    return urllib.parse.quote(datetime.fromtimestamp(t, UTC).isoformat())


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    """Job 7 on node1, node2 since T0; node2 failed at 500 and the step was retried in
    place; the marker says it restored step 100 at 510. Rank 0 on node1 reports step
    101 at 512 (2 s a step)."""
    a = Api(tmp_path)
    a.controller.clock = lambda: NOW
    start = datetime.fromtimestamp(T0, UTC)
    a.controller.jobs = [Job(7, "train", "RUNNING", nodes=("node1", "node3"), start_time=start)]
    for e in step_retry(500, bad="node2"):
        a.store.add_event(e.kind, e.message, e.at, node=e.node, job_id=e.job_id, cause=e.cause)
    a.store.add_event("resumed", "job 7 resumed from step 100 (restart 0)", T0 + 510, job_id=7)
    rank = RankProgress(rank=0, pid=1, step=101, step_at=T0 + 512, last_s=2.0)
    progress = json.dumps([JobProgress(job_id=7, ranks=[rank]).model_dump(mode="json")])
    a.store.record_report(
        "node1", "a", 1, T0 + 515, "healthy", "{}", [], T0 + 515, progress=progress
    )
    yield a
    a.client.close()


def test_one_jobs_goodput(api: Api) -> None:
    resp = api.get("/v1/jobs/7/goodput")
    assert resp.status_code == 200, resp.text
    g = resp.json()
    assert (g["job_id"], g["state"], g["nodes"], g["wall_s"]) == (7, "RUNNING", 2, 1000.0)
    lost = {c: v["seconds"] for c, v in g["lost"].items()}
    assert (lost["detection"], lost["drain"], lost["shrink"], lost["spare_in"]) == (1, 2.5, 0.5, 2)
    assert lost["restart"] == 6.0  # the first new step from node1's progress record
    assert lost["recompute"] is None  # the step before the fault: not in a latest record
    assert g["productive_s"] == pytest.approx(1000 - 12) and g["ettr"] == pytest.approx(0.988)
    [incident] = g["incidents"]
    assert incident["node"] == "node2" and incident["path"] == "step_retry"


def test_the_cluster_and_its_window(api: Api) -> None:
    whole = api.get("/v1/goodput").json()
    assert whole["jobs_counted"] == 1 and whole["since"] is None
    assert whole["wall_node_s"] == 2000.0 and whole["ettr"] == pytest.approx(0.988)
    later = api.get(f"/v1/goodput?since={iso(T0 + 900)}").json()
    assert later["wall_node_s"] == 200.0 and later["ettr"] == 1.0
    assert later["since"] == datetime.fromtimestamp(T0 + 900, UTC).isoformat().replace(
        "+00:00", "Z"
    )


def test_a_requeue_names_the_nodes_the_job_held_before(api: Api) -> None:
    """Slurm shows job 8 on node3 now; the requeue (an action's parameters) names node4,
    where the fault was."""
    start = datetime.fromtimestamp(T0 + 300, UTC)
    api.controller.jobs.append(Job(8, "t", "RUNNING", nodes=("node3",), start_time=start))
    api.store.add_event("fault", "node4: gpu0 xid79", T0 + 200, node="node4", cause="gpu0 xid79")
    api.store.add_event("requeue", "requeue job 8", T0 + 210, job_id=8)
    api.store.add_action("requeue", None, 8, "", "urgent fault", T0 + 209, {"nodes": ["node4"]})
    g = api.get("/v1/jobs/8/goodput").json()
    assert g["lost"]["detection"]["seconds"] == 10.0 and g["lost"]["queue_wait"]["seconds"] == 90.0


def test_the_job_detail_carries_its_goodput(api: Api) -> None:
    api.store.upsert_job(TrackedJob(7, 3))
    detail = api.get("/v1/jobs/7").json()
    assert detail["goodput"] == api.get("/v1/jobs/7/goodput").json()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("since=yesterday", "since: expected an ISO 8601 time, got 'yesterday'"),
        ("since=12", "since: expected an ISO 8601 time, got '12'"),
        (f"since={iso(NOW + 60)}", "is in the future"),
        ("since=" + "9" * 65, "since"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/goodput", "/v1/jobs/7/goodput"])
def test_a_bad_since_is_a_422_naming_it(api: Api, path: str, query: str, message: str) -> None:
    resp = api.get(f"{path}?{query}")
    assert resp.status_code == 422, resp.text
    error = error_of(resp)
    assert error["code"] == "invalid" and message in error["message"]


@pytest.mark.parametrize("job_id", ["0", str(2**63), "abc", "-3"])
def test_a_job_id_out_of_range_is_a_422(api: Api, job_id: str) -> None:
    resp = api.get(f"/v1/jobs/{job_id}/goodput")
    assert resp.status_code == 422 and error_of(resp)["code"] == "invalid"


def test_a_job_nothing_names_is_a_404(api: Api) -> None:
    resp = api.get("/v1/jobs/4242/goodput")
    assert resp.status_code == 404
    assert error_of(resp)["message"] == (
        "job 4242: no record of it (not in Slurm's view, no event, no progress)"
    )


@pytest.mark.parametrize("path", ["/v1/goodput", "/v1/jobs/7/goodput"])
def test_goodput_needs_an_identity(api: Api, path: str) -> None:
    resp = api.get(path, who=None)
    assert resp.status_code == 401 and error_of(resp)["code"] == "unauthenticated"
    assert api.get(path, who="node2").status_code == 200  # any identity reads, as elsewhere


def sample(name: str, labels: dict[str, str] | None = None) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels or {})


def test_the_gauges_at_scrape_time_at_most_once_a_minute(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[float] = []
    real = goodput_api.cluster_of

    def counted(controller: Any, now: float, since: float | None) -> ClusterGoodput:
        calls.append(now)
        return real(controller, now, since)

    monkeypatch.setattr(goodput_api, "cluster_of", counted)
    text = api.client.get("/metrics").text
    assert 'hyperpod_goodput_job_ettr{job="7"} 0.988' in text
    assert sample("hyperpod_goodput_ettr") == pytest.approx(0.988)
    assert sample("hyperpod_goodput_lost_node_seconds", {"cause": "drain"}) == 5.0
    assert sample("hyperpod_goodput_job_lost_seconds", {"job": "7", "cause": "shrink"}) == 0.5
    assert sample("hyperpod_goodput_job_lost_seconds", {"job": "7", "cause": "recompute"}) is None
    assert sample("hyperpod_goodput_success") == 1.0
    assert calls == [NOW]
    api.client.get("/metrics")
    assert len(calls) == 1  # within the minute: the gauges as they were
    api.controller.clock = lambda: NOW + goodput_api.METRICS_EVERY_S
    api.client.get("/metrics")
    assert len(calls) == 2


def test_a_failed_computation_says_so_and_the_scrape_still_answers(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_args: Any) -> ClusterGoodput:
        raise RuntimeError("store gone")

    monkeypatch.setattr(goodput_api, "cluster_of", broken)
    resp = api.client.get("/metrics")
    assert resp.status_code == 200 and sample("hyperpod_goodput_success") == 0.0
    assert "computing the last day's goodput failed" in caplog.text


def job(job_id: int, state: str | None, end: float | None, lost: float) -> JobGoodput:
    return JobGoodput(
        job_id=job_id,
        state=state,
        nodes=1,
        start=datetime.fromtimestamp(T0, UTC),
        end=None if end is None else datetime.fromtimestamp(end, UTC),
        wall_s=100.0,
        productive_s=100.0 - lost,
        unaccounted_s=0.0,
        ettr=(100.0 - lost) / 100.0,
        lost={"detection": Lost(seconds=lost)},
        incidents=[],
    )


def test_per_job_series_are_bounded() -> None:
    """Running jobs and jobs ended within the hour get series, the most lost first, at
    most GOODPUT_MAX_JOBS; a job ended earlier has none."""
    jobs = [job(i, "RUNNING", None, lost=i % 7) for i in range(1, 61)]
    jobs += [job(100, "COMPLETED", NOW - 60, 50.0), job(101, "COMPLETED", NOW - 7200, 90.0)]
    jobs.append(job(102, None, NOW - 30, 60.0))  # Slurm forgot it; its last record is recent
    cluster = ClusterGoodput(
        since=None,
        until=datetime.fromtimestamp(NOW, UTC),
        jobs_counted=len(jobs),
        wall_node_s=0.0,
        productive_node_s=0.0,
        unaccounted_node_s=0.0,
        ettr=None,
        lost_node_s={},
        jobs=jobs,
    )
    shown = metrics.goodput_series(cluster, NOW)
    assert len(shown) == metrics.GOODPUT_MAX_JOBS == 50
    assert [j.job_id for j in shown[:2]] == [102, 100] and 101 not in {j.job_id for j in shown}
    metrics.set_goodput(cluster, NOW)
    assert sample("hyperpod_goodput_job_ettr", {"job": "101"}) is None
    assert sample("hyperpod_goodput_job_ettr", {"job": "100"}) == 0.5
    assert sample("hyperpod_goodput_ettr") != sample("hyperpod_goodput_ettr")  # NaN: no jobs
    metrics.set_goodput(cluster.model_copy(update={"jobs": jobs[:1]}), NOW)
    assert sample("hyperpod_goodput_job_ettr", {"job": "100"}) is None  # gone with its job


def test_a_requeue_the_controller_makes_names_the_nodes_it_left(tmp_path: Path) -> None:
    """What job_record reads of a requeue is what a real pass records."""
    from ctl_helpers import job as slurm_job

    api = Api(tmp_path)
    api.slurm.jobs[7] = slurm_job(7, state="NODE_FAIL", nodes=("node2",), auto_resume=4)
    api.controller.reconcile_once()
    record = job_record(7, None, api.store.job_actions(7))
    assert record.nodes == {"node2"}
    api.client.close()
