"""What agents and Slurm's epilog send the controller: reports, heartbeats and job-end
notices. Validated for order and time, stored, and the loop woken when it matters.

Reports and heartbeats also feed the hang judgement's memory (hangs/memory.py): a
heartbeat is the only news of a hung job, and news of a job judged hung once runs the
pass at once, for its second judgement."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.hangs.memory import HangMemory
from hyperpod_agent.controller.jobwatch import JobWatch
from hyperpod_agent.controller.report_faults import faults_from_report
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.health import Action, NodeReport, Verdict
from hyperpod_agent.slurm.models import Job

MAX_SEQ = 2**63 - 1  # stored as a SQLite INTEGER
# An epilog notice this soon after our requeue of the job is that requeue's.
REQUEUE_EPILOG_S = 60.0


class Rejected(HyperpodError):
    """An agent message the controller refuses; ``status`` and ``code`` go to the client."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True)
class Heartbeat:
    node: str
    agent_id: str
    seq: int
    sent_at: float  # as received: the agent's clock; as kept in _beats: when it arrived


class Ingest:
    """The controller's inputs (mixed into ``Controller``, which sets these fields)."""

    config: ControllerConfig
    store: Store
    clock: Callable[[], float]
    wake: threading.Event
    watch: JobWatch
    jobs: list[Job]
    _beats: dict[str, Heartbeat]
    _pending_beats: dict[str, tuple[str, int, float]]
    _ingest_lock: threading.Lock
    _hang_memory: HangMemory | None = None
    _hang_memory_lock = threading.Lock()  # only to make it once

    @property
    def hang_memory(self) -> HangMemory:
        """What the hang judgement remembers between passes (the policy passes it to
        ``hangs.judge.judge``). Made on first use from the stored reports, so after a
        restart the heartbeats of a hung job attest the report stored before it."""
        if self._hang_memory is None:
            with self._hang_memory_lock:
                if self._hang_memory is None:
                    memory = HangMemory(self.config.progress)
                    for name, row in self.store.node_rows().items():
                        agent, seq, made, got = (
                            row.agent_id,
                            row.seq,
                            row.generated_at,
                            row.received_at,
                        )
                        if agent is not None and seq is not None and made and got:
                            memory.report(name, agent, seq, made, got)
                    self._hang_memory = memory
        return self._hang_memory

    def _check_time(self, sent: float, now: float, what: str) -> None:
        policy = self.config.policy
        if sent > now + policy.clock_skew_s:
            raise Rejected(
                409,
                "from_future",
                f"{what} is {sent - now:.0f} s in the future "
                f"(clock_skew_s {policy.clock_skew_s:g}); check the node's clock",
            )
        if now - sent > policy.report_max_age_s:
            raise Rejected(
                409,
                "stale",
                f"{what} is {now - sent:.0f} s old (report_max_age_s {policy.report_max_age_s:g})",
            )

    def ingest_report(self, report: NodeReport) -> int:
        """Validate ordering, store, open/close faults; returns the open fault count."""
        now = self.clock()
        if report.seq > MAX_SEQ:
            raise Rejected(422, "invalid", f"seq: must be at most {MAX_SEQ}")
        generated = report.generated_at.timestamp()
        self._check_time(generated, now, "report")
        with self._ingest_lock:
            last = self.store.node_row(report.node)
            if last is not None and last.agent_id is not None and last.seq is not None:
                if last.agent_id == report.agent_id and report.seq <= last.seq:
                    raise Rejected(
                        409,
                        "replayed",
                        f"report seq {report.seq} from agent "
                        f"{report.agent_id} is not newer than {last.seq}",
                    )
                if (
                    last.agent_id != report.agent_id
                    and last.generated_at is not None
                    and generated <= last.generated_at
                ):
                    raise Rejected(409, "stale", "report is older than the last accepted one")
            seen = faults_from_report(report, self.config.policy)
            opened, closed = self.store.record_report(
                report.node,
                report.agent_id,
                report.seq,
                generated,
                report.verdict.value,
                report.model_dump_json(),
                seen.faults,
                now,
                json.dumps({str(k): v for k, v in report.jobs_opted_in.items()}),
                progress=json.dumps([p.model_dump(mode="json") for p in report.progress]),
                keep=seen.keep,
                keep_probes=seen.keep_probes,
            )
            # In the store's order (under the same lock): the memory's report is the
            # stored one.
            hang_news = self.hang_memory.report(
                report.node, report.agent_id, report.seq, generated, now, report.progress
            )
        for f in opened:
            metrics.FAULTS.labels(f.code).inc()
            self.store.add_event(
                "fault",
                f"{f.node}: {f.component} {f.code} ({f.action}"
                f"{', urgent' if f.urgent else ''}): {f.message}",
                now,
                node=f.node,
                cause=f"{f.component} {f.code}",
            )
        for f in closed:
            self.store.add_event(
                "fault_cleared",
                f"{f.node}: {f.component} {f.code} cleared",
                now,
                node=f.node,
                cause=f"{f.component} {f.code}",
            )
        metrics.REPORTS.labels("report", "accepted").inc()
        if (
            any(Action(f.action).takes_out for f in opened)
            or closed
            or (
                report.verdict is Verdict.HEALTHY
                and last is not None
                and last.verdict != Verdict.HEALTHY.value
            )
            or hang_news  # a job judged hung once: its second judgement, now
        ):
            self.wake.set()  # act now, not at the next tick
        return len(seen.faults)

    def ingest_heartbeat(self, beat: Heartbeat) -> None:
        """Accept a heartbeat if newer than the last one from that agent."""
        now = self.clock()
        self._check_time(beat.sent_at, now, "heartbeat")
        with self._ingest_lock:
            last = self._beats.get(beat.node)
            if last is not None and last.agent_id == beat.agent_id and beat.seq <= last.seq:
                raise Rejected(
                    409,
                    "replayed",
                    f"heartbeat seq {beat.seq} from agent "
                    f"{beat.agent_id} is not newer than {last.seq}",
                )
            self._beats[beat.node] = Heartbeat(beat.node, beat.agent_id, beat.seq, now)
            self._pending_beats[beat.node] = (beat.agent_id, beat.seq, now)
            # sent_at on the node's clock: the clock its ranks' step times are on.
            hang_news = self.hang_memory.heartbeat(
                beat.node, beat.agent_id, beat.seq, beat.sent_at, now
            )
        metrics.REPORTS.labels("heartbeat", "accepted").inc()
        if hang_news:
            self.wake.set()  # a job past its hang limit, or due its second judgement

    def job_ended(self, job_id: int, exit_code: int | None, state: str | None, who: str) -> bool:
        """EpilogSlurmctld says ``job_id`` ended: record it and wake the loop, so an
        auto-resume job is requeued now rather than at the next tick.

        Returns whether the job is an auto-resume job. Ends of jobs known not to have
        opted in are neither recorded nor acted on (the epilog runs for every job).
        """
        now = self.clock()
        tracked = self.store.job(job_id)
        known = next((j for j in self.jobs if j.job_id == job_id), None)
        if tracked is not None or (known is not None and known.auto_resume):
            detail = ", ".join(
                part
                for part in (
                    f"state {state.upper()}" if state else "",
                    f"exit {exit_code}" if exit_code is not None else "",
                )
                if part
            )
            what = f"ended{f' ({detail})' if detail else ''}"
            if (
                tracked is not None
                and tracked.state == "requeued"
                and tracked.last_requeue_at is not None
                and now - tracked.last_requeue_at <= REQUEUE_EPILOG_S
            ):
                # Slurm runs the epilog when a requeue takes the job off its nodes, with
                # exit 0: that is the requeue we made, not a success.
                what = f"left its nodes for its requeue (attempt {tracked.attempts}/{tracked.cap})"
            self.store.add_event(
                "job_ended",
                f"job {job_id} {what}: reported by {who}",
                now,
                job_id=job_id,
                cause="EpilogSlurmctld",
            )
            self._follow_up(job_id)
            return True
        if known is None:
            self._follow_up(job_id)  # younger than our last pass: look at it now
        return False

    def _follow_up(self, job_id: int) -> None:
        self.watch.follow(job_id, self.clock())
        self.wake.set()

    def next_wait(self) -> float:
        """Seconds until the next pass: short while a notified job end is not visible yet."""
        return self.watch.wait(self.config.reconcile_interval_s)

    def last_heartbeat(self, node: str) -> float | None:
        beat = self._beats.get(node)
        return beat.sent_at if beat else None

    def _flush_heartbeats(self) -> None:
        with self._ingest_lock:
            pending, self._pending_beats = self._pending_beats, {}
        self.store.record_heartbeats(pending)
