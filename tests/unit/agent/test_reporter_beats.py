"""The reporter's heartbeats: each names a report built a moment before, never the same
report twice at the cadence, and a refused repeat is an answer, not an outage. Driven
by hand on a fake clock (the sending thread stopped), against a fake client."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hyperpod_agent.agent.reporter import Reporter, ReporterConfig
from hyperpod_agent.client import ControllerError
from hyperpod_agent.health import JobProgress, NodeReport, RankProgress, Verdict

CYCLE = 5.0


class Client:
    url = "fake"

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, int]] = []
        self.refuse = ""
        self.now = 0.0

    def report(self, body: dict[str, Any]) -> None:
        self.sent.append((self.now, "report", body["seq"]))

    def heartbeat(self, node: str, agent: str, seq: int, sent_at: str) -> None:
        if self.refuse:
            raise ControllerError(409, self.refuse, "not newer")
        self.sent.append((self.now, "beat", seq))


def made(seq: int) -> NodeReport:
    rank = RankProgress(rank=0, pid=1, step=15, step_at=1.0, proc_state="T")
    return NodeReport(
        node="node1", agent_id="a1", seq=seq, generated_at=datetime.now(UTC),
        verdict=Verdict.HEALTHY, progress=[JobProgress(job_id=8, ranks=[rank])],
    )  # fmt: skip


def reporter() -> tuple[Reporter, Client, list[float]]:
    clock = [0.0]
    cfg = ReporterConfig(url="http://127.0.0.1:9", self_drain=False)  # 30 s heartbeats
    rep = Reporter(cfg, "node1", clock=lambda: clock[0], progress_interval_s=CYCLE)
    rep.close()  # drive it by hand
    client = Client()
    rep._client = client  # type: ignore[assignment]
    return rep, client, clock


def drive(
    rep: Reporter, client: Client, clock: list[float], publishes: list[float], first: int = 1
) -> None:
    """Publish report first + i at publishes[i]; send whatever falls due in between and
    up to a cycle after the last."""
    for i, at in enumerate(publishes + [publishes[-1] + CYCLE]):
        while (report := rep._pending) is not None:
            due = rep._next_due(report, clock[0])
            if due > at:
                break
            clock[0] = client.now = max(clock[0], due)
            rep._step(report, clock[0])
        clock[0] = client.now = at
        if i < len(publishes):
            rep.publish(made(first + i))


def test_a_heartbeat_rides_on_the_report_just_published() -> None:
    rep, client, clock = reporter()
    publishes = [0.3 + CYCLE * k + 0.01 * (k % 3) for k in range(12)]  # a little jitter
    drive(rep, client, clock, publishes)
    assert client.sent[0] == (publishes[0], "report", 1)
    beats = [(at, seq) for at, kind, seq in client.sent if kind == "beat"]
    # One per report, each sent as its report was published, naming it.
    assert beats == [(publishes[s - 1], s) for s in range(2, 13)]


def test_a_late_report_is_waited_for_not_named_twice() -> None:
    rep, client, clock = reporter()
    publishes = [0.3 + CYCLE * k for k in range(8)]
    publishes[5:] = [at + 1.5 for at in publishes[5:]]  # a cycle ran 1.5 s late
    drive(rep, client, clock, publishes)
    seqs = [seq for _, kind, seq in client.sent if kind == "beat"]
    assert seqs == sorted(set(seqs)) == list(range(2, 9))


def test_a_refused_repeat_is_an_answer() -> None:
    rep, client, clock = reporter()
    drive(rep, client, clock, [0.3, 5.3])
    client.refuse = "replayed"  # a retry across a timeout delivered it twice, say
    drive(rep, client, clock, [10.3], first=3)
    assert rep.state == "ok" and not rep._resend
    client.refuse = ""
    drive(rep, client, clock, [15.3], first=4)
    assert client.sent[-1] == (15.3, "beat", 4)


def moved(seq: int, step: int) -> NodeReport:
    report = made(seq)
    rank = report.progress[0].ranks[0].model_copy(update={"step": step, "step_at": step / 10})
    return report.model_copy(update={"progress": [JobProgress(job_id=8, ranks=[rank])]})


def test_a_report_whose_progress_moved_is_never_named_early() -> None:
    rep, client, clock = reporter()
    drive(rep, client, clock, [0.3])  # report 1 in full
    for at, report in ((5.3, moved(2, 16)), (9.0, moved(3, 17))):
        clock[0] = client.now = at  # 9.0: past where a heartbeat's window opens (7.8)
        rep.publish(report)
        while (due := rep._next_due(report, clock[0])) <= 20.0:
            clock[0] = client.now = max(clock[0], due)
            rep._step(report, clock[0])
            if client.sent[-1][2] == report.seq:
                break
    # Report 3 is not named by a heartbeat at 9.0: it goes in full when the progress
    # interval since report 2 (in full at 5.3) passed.
    assert client.sent[1:] == [(5.3, "report", 2), (10.3, "report", 3)]
