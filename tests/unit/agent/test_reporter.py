"""Reporter against a real HTTP server on loopback that records and fails on demand."""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hyperpod_agent.agent.reporter import Reporter, ReporterConfig, fingerprint
from hyperpod_agent.agent.selfdrain import self_drain_reason
from hyperpod_agent.auth.config import AuthConfig
from hyperpod_agent.auth.server import ServerAuth
from hyperpod_agent.auth.tokens import derive_key
from hyperpod_agent.health import (
    Action,
    FaultRef,
    Finding,
    JobProgress,
    NodeReport,
    ProbeResult,
    RankProgress,
    Status,
    Verdict,
)
from hyperpod_agent.slurm.models import Node


class Recorder:
    """What the stub controller saw, and how it should answer next."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.status = 200
        self.gate: threading.Event | None = None
        self.arrived = threading.Event()
        self.auth: ServerAuth | None = None
        self.identities: list[str | None] = []
        self.lock = threading.Lock()

    def paths(self) -> list[str]:
        with self.lock:
            return [path for _, path, _, _ in self.requests]

    def bodies(self, path: str) -> list[Any]:
        with self.lock:
            return [body for _, p, _, body in self.requests if p == path]


def make_handler(rec: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            rec.arrived.set()
            if rec.gate is not None:
                rec.gate.wait(10)
            with rec.lock:
                rec.requests.append((self.command, self.path, dict(self.headers), json.loads(raw)))
                status = rec.status
            if rec.auth is not None:
                ident = rec.auth.verify(self.command, self.path, dict(self.headers), raw)
                rec.identities.append(ident.node)
            if status == 200:
                out = b"{}"
            else:
                out = json.dumps({"error": {"code": "nope", "message": f"said {status}"}}).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the reporter was closed while we answered

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[str, Recorder]]:
    rec = Recorder()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(rec))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", rec
    finally:
        if rec.gate is not None:
            rec.gate.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def config(url: str, **fields: Any) -> ReporterConfig:
    base: dict[str, Any] = {
        "url": url,
        "auth": {"mode": "none"},
        "heartbeat_interval_s": 0.2,
        "timeout_s": 2,
        "backoff_initial_s": 0.02,
        "backoff_max_s": 0.1,
    }
    base.update(fields)
    return ReporterConfig.model_validate(base)


SEQ = iter(range(1, 1_000_000))


def report(
    verdict: Verdict = Verdict.HEALTHY, urgent: bool = False, code: str = "xid79"
) -> NodeReport:
    findings = []
    if verdict != Verdict.HEALTHY:
        findings.append(
            Finding(
                component="gpu3",
                code=code,
                status=Status.FAIL,
                action=Action.REBOOT,
                urgent=urgent,
                message="GPU has fallen off the bus",
            )
        )
    status = Status.OK if verdict == Verdict.HEALTHY else Status.FAIL
    return NodeReport(
        node="node1",
        agent_id="a1",
        seq=next(SEQ),
        generated_at=datetime.now(UTC),
        verdict=verdict,
        action=Action.REBOOT if findings else Action.NONE,
        urgent=urgent,
        results=[ProbeResult(probe="gpu", status=status, findings=findings, at=datetime.now(UTC))],
    )


class Drains:
    """The node as Slurm has it, and the drains asked of it."""

    def __init__(self, fail: bool = False, reason: str = "") -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = fail
        self.reason = reason

    def node(self, name: str) -> Node:
        flags = frozenset({"DRAIN"}) if self.reason else frozenset()
        return Node(name, "IDLE", flags, self.reason, "root")

    def drain(self, node: str, reason: str) -> None:
        self.calls.append((node, reason))
        if self.fail:
            raise RuntimeError("scontrol: Unable to contact slurm controller")
        self.reason = reason


@pytest.fixture
def reporters() -> Iterator[list[Reporter]]:
    made: list[Reporter] = []
    yield made
    for rep in made:
        rep.close()


def start(reporters: list[Reporter], cfg: ReporterConfig, **kw: Any) -> Reporter:
    rep = Reporter(cfg, "node1", **kw)
    reporters.append(rep)
    return rep


def test_first_report_is_sent_in_full(server: tuple[str, Recorder], reporters: list) -> None:
    url, rec = server
    rep = start(reporters, config(url, heartbeat_interval_s=60))
    first = report()
    rep.publish(first)
    wait_for(lambda: rec.paths() == ["/v1/reports"])
    assert rec.bodies("/v1/reports")[0] == first.model_dump(mode="json")
    wait_for(lambda: rep.state == "ok")


def test_unchanged_reports_become_heartbeats(server: tuple[str, Recorder], reporters: list) -> None:
    url, rec = server
    rep = start(reporters, config(url))
    rep.publish(report())
    wait_for(lambda: len(rec.paths()) == 1)
    latest = report()  # same state, new seq and times
    rep.publish(latest)
    wait_for(lambda: len(rec.bodies("/v1/heartbeats")) >= 2)
    assert rec.paths().count("/v1/reports") == 1
    beat = rec.bodies("/v1/heartbeats")[-1]
    assert beat["node"] == "node1" and beat["agent_id"] == "a1" and beat["seq"] == latest.seq
    assert datetime.fromisoformat(beat["sent_at"]).tzinfo is not None


def test_changed_verdict_is_sent_in_full(server: tuple[str, Recorder], reporters: list) -> None:
    url, rec = server
    rep = start(reporters, config(url, heartbeat_interval_s=60))
    rep.publish(report())
    wait_for(lambda: len(rec.paths()) == 1)
    rep.publish(report(Verdict.FAULTY, urgent=True))
    wait_for(lambda: len(rec.paths()) == 2)
    assert rec.bodies("/v1/reports")[1]["verdict"] == "faulty"


def test_publish_never_waits_for_the_controller(
    server: tuple[str, Recorder], reporters: list
) -> None:
    url, rec = server
    rec.gate = threading.Event()  # the controller hangs until released
    rep = start(reporters, config(url, timeout_s=30))
    rep.publish(report())
    assert rec.arrived.wait(10)  # the first send is now stuck in the controller
    for _ in range(50):  # would deadlock here if publish waited for the send
        rep.publish(report(Verdict.DEGRADED))
    rec.gate.set()
    wait_for(lambda: rec.paths().count("/v1/reports") == 2)
    assert rec.bodies("/v1/reports")[1]["verdict"] == "degraded"


def test_only_the_newest_report_is_sent_after_an_outage(
    server: tuple[str, Recorder], reporters: list
) -> None:
    url, rec = server
    rec.status = 503
    rep = start(reporters, config(url, heartbeat_interval_s=60, self_drain=False))
    rep.publish(report())
    wait_for(lambda: len(rec.paths()) >= 2)  # retried
    wait_for(lambda: rep.state == "unreachable")
    rep.publish(report(Verdict.DEGRADED))
    newest = report(Verdict.FAULTY)
    rep.publish(newest)
    with rec.lock:
        rec.status = 200
        seen = len(rec.requests)
    wait_for(lambda: rep.state == "ok")
    after = rec.bodies("/v1/reports")[seen:]
    assert after[-1]["seq"] == newest.seq
    assert all(body["verdict"] == "faulty" for body in after[1:])


def test_full_report_is_resent_after_the_controller_returns(
    server: tuple[str, Recorder], reporters: list
) -> None:
    url, rec = server
    rep = start(reporters, config(url, self_drain=False))
    rep.publish(report())
    wait_for(lambda: len(rec.paths()) == 1)
    rec.status = 503  # the next heartbeat fails
    wait_for(lambda: rep.state == "unreachable")
    rec.status = 200
    wait_for(lambda: rep.state == "ok")
    assert rec.paths()[-1] == "/v1/reports"


def test_rejected_report_is_not_hammered(
    server: tuple[str, Recorder], reporters: list, caplog: pytest.LogCaptureFixture
) -> None:
    url, rec = server
    rec.status = 422
    with caplog.at_level(logging.WARNING, logger="hyperpod_agent.agent.reporter"):
        rep = start(reporters, config(url, heartbeat_interval_s=0.3))
        rep.publish(report())
        wait_for(lambda: len(rec.paths()) >= 3, timeout=10)
    assert rep.state == "rejected"
    refusals = [r for r in caplog.records if "refused the report" in r.getMessage()]
    assert len(refusals) == 1
    assert "said 422 (HTTP 422, nope)" in refusals[0].getMessage()
    # Re-sent at the heartbeat cadence, not in a tight loop.
    assert len(rec.paths()) <= 1 + 10


def test_self_drain_when_unreachable_with_an_urgent_fault(reporters: list) -> None:
    drains = Drains()
    cfg = config(closed_port_url(), self_drain_after_s=0.2)
    rep = start(reporters, cfg, slurm=drains)
    rep.publish(report(Verdict.FAULTY, urgent=True))
    wait_for(lambda: len(drains.calls) == 1)
    assert drains.calls[0] == ("node1", "hyperpod:reboot gpu3 xid79 GPU has fallen off the bus")
    assert rep.state == "unreachable"
    rep.publish(report(Verdict.FAULTY, urgent=True))  # same fault: drained once
    rep.publish(report(Verdict.FAULTY, urgent=True, code="xid151"))  # already out by us
    time.sleep(0.5)
    assert len(drains.calls) == 1


def test_in_observe_mode_a_self_drain_is_told_and_counted_not_done(
    reporters: list, caplog: pytest.LogCaptureFixture
) -> None:
    drains = Drains()
    cfg = config(closed_port_url(), self_drain_after_s=0.1, mode="observe")
    rep = start(reporters, cfg, slurm=drains)
    counted: list[str] = []
    rep.count_would_have(counted.append)
    rep.publish(report(Verdict.FAULTY, urgent=True))
    wait_for(lambda: counted == ["self_drain"])
    assert drains.calls == []
    assert "observe: would self-drain node1 (hyperpod:reboot gpu3 xid79" in caplog.text
    rep.publish(report(Verdict.FAULTY, urgent=True))  # the same fault: told once
    time.sleep(0.4)
    assert counted == ["self_drain"] and drains.calls == []


def test_same_fault_after_recovery_drains_again_not_sooner_than_allowed(
    reporters: list,
) -> None:
    drains = Drains()
    cfg = config(closed_port_url(), self_drain_after_s=0.1, self_drain_min_interval_s=0.8)
    rep = start(reporters, cfg, slurm=drains)
    rep.publish(report(Verdict.FAULTY, urgent=True))
    wait_for(lambda: len(drains.calls) == 1)
    drains.reason = ""  # resumed meanwhile (say by an admin)
    rep.publish(report())
    time.sleep(0.2)
    started = time.monotonic()
    rep.publish(report(Verdict.FAULTY, urgent=True))
    wait_for(lambda: len(drains.calls) == 2)
    assert time.monotonic() - started >= 0.4  # held back by the minimum interval


@pytest.mark.parametrize(
    "reason",
    [
        "maintenance",
        "Not responding to IPMI - RMA 1234, keep out",
        "hyperpod:spare",
        "Action:Replace",
    ],
)
def test_self_drain_never_touches_a_node_out_for_somebody_elses_reason(
    reporters: list, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    drains = Drains(reason=reason)
    rep = start(reporters, config(closed_port_url(), self_drain_after_s=0.05), slurm=drains)
    with caplog.at_level(logging.WARNING, logger="hyperpod_agent.agent.selfdrain"):
        rep.publish(report(Verdict.FAULTY, urgent=True))
        wait_for(lambda: any("not touching it" in r.getMessage() for r in caplog.records))
        time.sleep(0.3)
    assert drains.calls == [] and drains.reason == reason
    assert sum("not touching it" in r.getMessage() for r in caplog.records) == 1


def test_slurms_own_reason_does_not_stop_a_self_drain(reporters: list) -> None:
    drains = Drains(reason="Not responding")
    rep = start(
        reporters,
        config(closed_port_url(), self_drain_after_s=0.05, slurm_user="root"),
        slurm=drains,
    )
    rep.publish(report(Verdict.FAULTY, urgent=True))
    wait_for(lambda: len(drains.calls) == 1)


def test_a_controller_answering_503_is_up_no_self_drain(
    server: tuple[str, Recorder], reporters: list
) -> None:
    # Its munged is down during a shared-cause fault: every node would self-drain.
    url, rec = server
    rec.status = 503
    drains = Drains()
    rep = start(reporters, config(url, self_drain_after_s=0.05), slurm=drains)
    rep.publish(report(Verdict.FAULTY, urgent=True))
    wait_for(lambda: len(rec.paths()) >= 6)  # well past self_drain_after_s
    assert drains.calls == []


@pytest.mark.parametrize(
    ("fields", "fault"),
    [
        ({"self_drain": False}, report(Verdict.FAULTY, urgent=True)),
        ({}, report(Verdict.FAULTY, urgent=False)),
        ({}, report(Verdict.DEGRADED, urgent=True)),
    ],
)
def test_no_self_drain_unless_enabled_urgent_and_faulty(
    reporters: list, fields: dict[str, Any], fault: NodeReport
) -> None:
    drains = Drains()
    rep = start(
        reporters, config(closed_port_url(), self_drain_after_s=0.05, **fields), slurm=drains
    )
    rep.publish(fault)
    wait_for(lambda: rep.state == "unreachable")
    time.sleep(0.4)  # well past self_drain_after_s
    assert drains.calls == []


def test_no_self_drain_while_the_controller_answers(
    server: tuple[str, Recorder], reporters: list
) -> None:
    url, rec = server
    drains = Drains()
    rep = start(reporters, config(url, self_drain_after_s=0.05), slurm=drains)
    rep.publish(report(Verdict.FAULTY, urgent=True))
    wait_for(lambda: len(rec.paths()) >= 3)
    assert drains.calls == []


def test_failed_self_drain_is_retried_without_spinning(reporters: list) -> None:
    drains = Drains(fail=True)
    cfg = config(closed_port_url(), self_drain_after_s=0.05, backoff_max_s=0.2)
    rep = start(reporters, cfg, slurm=drains)
    rep.publish(report(Verdict.FAULTY, urgent=True))
    wait_for(lambda: len(drains.calls) >= 2)
    time.sleep(0.3)
    assert len(drains.calls) <= 6


def test_token_auth_speaks_for_its_node(
    server: tuple[str, Recorder], reporters: list, tmp_path: Path
) -> None:
    url, rec = server
    secret = tmp_path / "secret"
    secret.write_bytes(b"k" * 40)
    key = tmp_path / "node1.key"
    key.write_text(derive_key(b"k" * 40, "node:node1").hex())
    rec.auth = ServerAuth(AuthConfig(mode="token", token_secret_file=secret))
    auth = {"mode": "token", "token_key_file": str(key)}
    rep = start(reporters, config(url, auth=auth, heartbeat_interval_s=0.1))
    rep.publish(report())
    wait_for(lambda: len(rec.identities) >= 3)
    assert set(rec.identities) == {"node1"}


def test_disabled_without_url() -> None:
    rep = Reporter(ReporterConfig(), "node1")
    assert not rep.enabled and rep._thread is None
    rep.publish(report())
    rep.close()


def test_close_stops_the_thread(server: tuple[str, Recorder]) -> None:
    url, _ = server
    rep = Reporter(config(url), "node1")
    rep.publish(report())
    rep.close()
    assert rep._thread is not None and not rep._thread.is_alive()


def test_backoff_grows_and_stays_bounded() -> None:
    cfg = config("", backoff_initial_s=1, backoff_max_s=30, backoff_jitter=0.2)
    rep = Reporter(cfg, "node1", rng=random.Random(7))
    delays = []
    for attempt in range(10):
        rep._attempt = attempt
        delays.append(rep._backoff())
    for attempt, delay in enumerate(delays):
        base = min(30.0, 2.0**attempt)
        assert base * 0.8 <= delay <= min(30.0, base * 1.2)
    assert delays[-1] <= 30.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"url": "ftp://head:1"}, "expected http://HOST:PORT"),
        ({"url": "head:8080"}, "expected http://HOST:PORT"),
        ({"backoff_initial_s": 10, "backoff_max_s": 5}, "backoff_max_s \\(5\\) is below"),
        ({"heartbeat_interval_s": 0}, "heartbeat_interval_s"),
        ({"backoff_jitter": 1.5}, "backoff_jitter"),
        ({"retries": 3}, "retries"),
    ],
)
def test_config_rejects_bad_values(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ReporterConfig.model_validate(fields)


def test_fingerprint_ignores_times_and_seq() -> None:
    a, b = report(), report()
    assert a.seq != b.seq and fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint(report(Verdict.DEGRADED))
    assert fingerprint(a) != fingerprint(a.model_copy(update={"jobs_opted_in": {7: 1}}))
    confirmed = [FaultRef(probe="gpu", component="gpu0", code="xid79")]
    assert fingerprint(a) != fingerprint(a.model_copy(update={"confirmed": confirmed}))


def test_self_drain_reason_without_findings() -> None:
    bare = report().model_copy(
        update={
            "verdict": Verdict.FAULTY,
            "urgent": True,
            "action": Action.REPLACE,
            "message": "GPU count 7 < 8",
        }
    )
    assert self_drain_reason(bare) == ("node fault", "hyperpod:replace node fault GPU count 7 < 8")


def with_progress(base: NodeReport, *ranks: RankProgress) -> NodeReport:
    """``base`` carrying one job's progress (job 42), with a fresh seq."""
    job = JobProgress(job_id=42, ranks=list(ranks))
    return base.model_copy(update={"seq": next(SEQ), "progress": [job]})


def rank(step: int, **fields: Any) -> RankProgress:
    base: dict[str, Any] = {"rank": 0, "pid": 100, "step": step, "proc_state": "R"}
    base.update(fields)
    return RankProgress(**base)


def test_progress_only_changes_wait_for_the_progress_interval(
    server: tuple[str, Recorder], reporters: list
) -> None:
    url, rec = server
    rep = start(reporters, config(url, heartbeat_interval_s=0.1), progress_interval_s=3600)
    base = report()
    rep.publish(with_progress(base, rank(1)))
    wait_for(lambda: len(rec.bodies("/v1/reports")) == 1)
    stepped = with_progress(base, rank(2, step_at=1.0, median_s=0.5, last_s=0.5))
    rep.publish(stepped)
    # A heartbeat naming the stepped report's seq: it was seen and not sent in full.
    wait_for(lambda: any(b["seq"] == stepped.seq for b in rec.bodies("/v1/heartbeats")))
    assert len(rec.bodies("/v1/reports")) == 1
    # These are real changes: each goes at once.
    changes = [
        with_progress(base, rank(3, paused=True, pause_reason="checkpoint")),
        with_progress(base, rank(3, paused=True, pause_reason="checkpoint", proc_state="T")),
        with_progress(base, rank(3, proc_state="T", paused=True), rank(3, rank=1)),
        base.model_copy(update={"seq": next(SEQ)}),  # the job left the node
    ]
    for n, change in enumerate(changes, start=2):
        rep.publish(change)
        wait_for(lambda n=n: len(rec.bodies("/v1/reports")) == n)  # type: ignore[misc]
        assert rec.bodies("/v1/reports")[-1]["seq"] == change.seq


def test_progress_only_changes_are_sent_at_the_progress_interval(
    server: tuple[str, Recorder], reporters: list
) -> None:
    url, rec = server
    rep = start(reporters, config(url, heartbeat_interval_s=3600), progress_interval_s=0.05)
    base = report()
    rep.publish(with_progress(base, rank(1)))
    wait_for(lambda: len(rec.bodies("/v1/reports")) == 1)
    stepped = with_progress(base, rank(2))
    rep.publish(stepped)
    wait_for(lambda: len(rec.bodies("/v1/reports")) == 2)
    assert rec.bodies("/v1/reports")[1]["progress"][0]["ranks"][0]["step"] == 2


def test_a_node_whose_ranks_stopped_still_says_so_at_the_progress_cadence(
    server: tuple[str, Recorder], reporters: list
) -> None:
    """A stopped job sends no new report: the heartbeat, at the progress cadence while
    ranks here record progress, is what tells the controller "nothing moved" from "the
    agent is silent" (the hang judgement)."""
    url, rec = server
    rep = start(reporters, config(url, heartbeat_interval_s=3600), progress_interval_s=0.05)
    stopped = with_progress(report(), rank(5))
    rep.publish(stopped)
    wait_for(lambda: len(rec.bodies("/v1/heartbeats")) >= 3)
    assert len(rec.bodies("/v1/reports")) == 1
    assert {b["seq"] for b in rec.bodies("/v1/heartbeats")} == {stopped.seq}


def test_no_faster_heartbeat_without_ranks_recording_progress(
    server: tuple[str, Recorder], reporters: list
) -> None:
    url, rec = server
    rep = start(reporters, config(url, heartbeat_interval_s=3600), progress_interval_s=0.05)
    rep.publish(report())
    wait_for(lambda: len(rec.bodies("/v1/reports")) == 1)
    time.sleep(0.5)  # ten progress intervals: no heartbeat is due in them
    assert rec.bodies("/v1/heartbeats") == []


def test_fingerprint_sees_progress_structure_not_steps() -> None:
    base = report()
    one = with_progress(base, rank(1))
    assert fingerprint(one) == fingerprint(with_progress(base, rank(7, median_s=2.0)))
    assert fingerprint(one) != fingerprint(base)
    assert fingerprint(one) != fingerprint(with_progress(base, rank(1, paused=True)))
    assert fingerprint(one) != fingerprint(with_progress(base, rank(1, proc_state="D")))
    assert fingerprint(one) != fingerprint(with_progress(base, rank(1), rank(1, rank=1)))
