"""Agent -> controller reporting.

:meth:`Reporter.publish` only stores the newest report and wakes a background thread,
so the agent's probe cycle never waits for the network. The thread sends the full
report when it changed (verdict, action, findings, opted-in jobs, a job or rank that
came or went, a rank pausing or resuming, a process changing state), a small heartbeat
every ``heartbeat_interval_s`` otherwise. Training progress moves every step: a report
whose only change is progress goes at most every ``progress_interval_s``, and while
ranks on the node record progress the heartbeat comes that often too: a job that stops
sends no new report, and the controller can only tell "stopped" from "agent silent"
by a heartbeat that says nothing changed (the hang judgement). A heartbeat names the
newest report (its seq) and says so up to when that report was built, so it rides on a
report just published (``_beat_due``); one naming the report named before says nothing
new, and the controller refuses it as a repeat (an answer, not an error). The thread
retries with bounded exponential back-off and jitter. If the controller stays
unreachable for ``self_drain_after_s`` while the node has an urgent fault, the agent
drains its own node with an owned reason, so a controller outage never hides a dead GPU
(DESIGN §1; the rules are in selfdrain.py). A controller that answers, even with an
error, is reachable.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hyperpod_agent.agent.selfdrain import NodeSlurm, SelfDrain
from hyperpod_agent.auth.client import ClientAuth
from hyperpod_agent.auth.config import AuthConfig, AuthError
from hyperpod_agent.client import (
    ControllerClient,
    ControllerError,
    ControllerUnreachable,
    parse_urls,
)
from hyperpod_agent.errors import ConfigError
from hyperpod_agent.health import JobProgress, NodeReport, Verdict

log = logging.getLogger(__name__)


class ReporterConfig(BaseModel):
    """``[controller]`` section of agent.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(
        default="",
        description="controller URL, or several comma-separated; empty disables reporting",
    )
    urls: list[str] = Field(
        default_factory=list, description="several controllers ([ha]): tried in turn"
    )
    auth: AuthConfig = Field(default_factory=AuthConfig)
    heartbeat_interval_s: float = Field(default=30.0, gt=0, le=3600)
    timeout_s: float = Field(default=5.0, gt=0, le=300)
    backoff_initial_s: float = Field(default=1.0, gt=0, le=600)
    backoff_max_s: float = Field(default=60.0, gt=0, le=3600)
    backoff_jitter: float = Field(default=0.2, ge=0, le=1, description="+- fraction")
    self_drain: bool = True
    mode: Literal["act", "observe"] = Field(
        default="act",
        description='"observe": a self-drain is decided, logged and counted, not done '
        "(the controller's [policy] mode, for the agent's one action of its own)",
    )
    self_drain_after_s: float = Field(default=120.0, gt=0)
    self_drain_min_interval_s: float = Field(
        default=600.0, ge=0, description="at most one self-drain per this many seconds"
    )
    slurm_user: str = Field(
        default="slurm",
        min_length=1,
        description="slurm.conf's SlurmUser: reasons Slurm writes carry this user",
    )
    slurm_conf: Path | None = None
    slurm_timeout_s: float = Field(default=10.0, gt=0, le=300)
    ca_file: Path | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value:
            return ""
        try:
            return ",".join(parse_urls(value))
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        try:
            return list(parse_urls(value)) if value else []
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    def controller_urls(self) -> tuple[str, ...]:
        """Every controller to report to, in order; empty when reporting is off."""
        return tuple(self.urls) or (parse_urls(self.url) if self.url else ())

    @model_validator(mode="after")
    def _backoff(self) -> ReporterConfig:
        if self.url and self.urls:
            raise ValueError("set url or urls, not both")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(
                f"backoff_max_s ({self.backoff_max_s:g}) is below "
                f"backoff_initial_s ({self.backoff_initial_s:g})"
            )
        return self


def fingerprint(report: NodeReport) -> tuple[Any, ...]:
    """What makes a report worth sending at once: everything but times, seq, prose and
    the progress that moves every step (``Reporter`` rate-limits that)."""
    results = tuple(
        (
            r.probe,
            r.status,
            tuple((f.component, f.code, f.status, f.action, f.urgent) for f in r.findings),
        )
        for r in sorted(report.results, key=lambda r: r.probe)
    )
    return (
        report.node,
        report.agent_id,
        report.verdict,
        report.action,
        report.urgent,
        results,
        # A finding passing its damping changes nothing else in the report.
        tuple(sorted((c.probe, c.component, c.code) for c in report.confirmed)),
        tuple(sorted(report.jobs_opted_in.items())),
        tuple(
            (
                job.job_id,
                job.hang_factor,
                job.hang_min_s,
                tuple((r.rank, r.pid, r.paused, r.pause_reason, r.proc_state) for r in job.ranks),
            )
            for job in report.progress
        ),
    )


def _slurm(config: ReporterConfig) -> NodeSlurm:
    from hyperpod_agent.slurm.client import SlurmClient

    return SlurmClient(slurm_conf=config.slurm_conf, timeout=config.slurm_timeout_s)


class Reporter:
    """Sends an agent's reports and heartbeats to the controller from a thread."""

    def __init__(
        self,
        config: ReporterConfig,
        node: str,
        *,
        slurm: NodeSlurm | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        progress_interval_s: float = 0.0,
    ) -> None:
        self.config = config
        self._progress_interval_s = progress_interval_s
        self.node = node
        self.enabled = bool(config.controller_urls())
        self._self_drain = SelfDrain(
            node,
            slurm or _slurm(config),
            enabled=config.self_drain,
            after_s=config.self_drain_after_s,
            min_interval_s=config.self_drain_min_interval_s,
            retry_s=config.backoff_max_s,
            slurm_user=config.slurm_user,
            observe=config.mode == "observe",
        )
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._pending: NodeReport | None = None
        self._published_at = 0.0  # when the pending report was published
        self._cycle = 0.0  # between the last two reports published (0: not seen yet)
        # Owned by the sending thread only:
        self._sent: tuple[Any, ...] | None = None
        self._sent_progress: list[JobProgress] = []
        self._named = 0  # the seq of the last report sent, or named by a heartbeat
        self._resend = False
        self._last_send = 0.0
        self._last_full = 0.0
        self._retry_at = 0.0
        self._attempt = 0
        self._down_since: float | None = None
        self._state = "starting"
        self._thread: threading.Thread | None = None
        if not self.enabled:
            log.info("no controller URL configured: not reporting")
            return
        auth = ClientAuth(config.auth, node)
        self._client = ControllerClient(
            config.controller_urls(), auth, config.timeout_s, ca_file=config.ca_file
        )
        self._thread = threading.Thread(target=self._run, name="hyperpod-reporter", daemon=True)
        self._thread.start()

    def publish(self, report: NodeReport) -> None:
        """Queue ``report`` for sending (replacing any unsent one); never blocks."""
        if not self.enabled:
            return
        now = self._clock()
        with self._lock:
            last = self._pending
            if last is not None and report.seq == last.seq + 1:
                self._cycle = now - self._published_at  # the agent's, as it publishes
            self._pending, self._published_at = report, now
        self._wake.set()

    def count_would_have(self, hook: Callable[[str], None]) -> None:
        """Count what observe mode left undone (the agent's metrics)."""
        self._self_drain.on_would_have = hook

    def close(self, timeout: float = 5.0) -> None:
        """Stop the sending thread; an unsent report is dropped."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def state(self) -> str:
        """``starting``, ``ok``, ``unreachable`` or ``rejected``."""
        return self._state

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                report = self._pending
            now = self._clock()
            try:
                delay = self._next_due(report, now) - now
                if delay <= 0:
                    self._step(report, now)
                    continue
            except Exception:
                # The loop must outlive any bug in one step; log it and go on slowly.
                log.exception("reporter step failed")
                self._retry_at = now + self.config.backoff_max_s
                self._self_drain.failed_step(now)
                delay = self.config.backoff_max_s
            self._wake.wait(delay if report is not None else None)
            self._wake.clear()

    def _next_due(self, report: NodeReport | None, now: float) -> float:
        if report is None:
            return now + 3600.0
        due = self._retry_at
        if self._sent != fingerprint(report) or self._resend:
            due = max(due, now)
        else:
            beat = self._beat_due(report)
            if report.progress != self._sent_progress:
                beat = min(beat, self._last_full + self._progress_interval_s)
            due = max(due, beat)
        drain_at = self._self_drain.due(report, self._down_since)
        return min(due, drain_at) if drain_at is not None else due

    def _beat_interval(self, report: NodeReport) -> float:
        """The heartbeat cadence: the progress cadence while ranks here record
        progress (so a stop is seen within it), the configured one otherwise."""
        beat = self.config.heartbeat_interval_s
        if report.progress and self._progress_interval_s > 0:
            return min(beat, self._progress_interval_s)
        return beat

    def _beat_due(self, report: NodeReport) -> float:
        """When the heartbeat naming ``report`` is due.

        It says "nothing changed" up to the report it names, so it rides on a report
        just published: once the interval is nearly up (half an agent cycle before), the
        next report goes as soon as it is published; one published before that waits
        for the next, half a cycle past the interval at most (then it goes itself). So
        heartbeats keep their interval on average and name a report built a moment
        before, not up to a cycle before. A report sent or named already (the agent
        built none since: a cycle running late, or its loop stuck) goes again two
        intervals after the last send: the controller refuses it as a repeat, an answer
        that still shows it reachable."""
        beat = self._beat_interval(report)
        if report.seq <= self._named:
            return self._last_send + 2 * beat
        if report.progress != self._sent_progress:
            # Its progress moved: never early, so the full report, due no later at the
            # shipped settings, goes instead (a heartbeat would say nothing changed).
            return self._last_send + beat
        slack = min(beat, self._cycle) / 2
        opens = self._last_send + beat - slack
        if self._published_at < opens:
            return opens + 2 * slack  # the next report, or this one at the latest then
        return self._published_at

    def _step(self, report: NodeReport | None, now: float) -> None:
        if report is None:
            return
        if report.verdict != Verdict.FAULTY:
            self._self_drain.healthy_again()
        if now >= self._retry_at:
            self._send(report, now)
        due = self._self_drain.due(report, self._down_since)
        if due is not None and now >= due:
            self._self_drain.run(report, now, now - (self._down_since or now))

    def _send(self, report: NodeReport, now: float) -> None:
        fp = fingerprint(report)
        full = (
            self._sent != fp
            or self._resend
            or (
                report.progress != self._sent_progress
                and now >= self._last_full + self._progress_interval_s
            )
        )
        try:
            if full:
                self._client.report(report.model_dump(mode="json"))
            elif now >= self._beat_due(report):
                sent_at = datetime.now(UTC).isoformat()
                self._client.heartbeat(report.node, report.agent_id, report.seq, sent_at)
            else:
                return
        except ControllerError as exc:
            if not full and exc.code == "replayed":
                # The controller has that report named already (this heartbeat named
                # it again, or a retry across a timeout delivered it twice): it is up
                # and has what this says; nothing to resend, nothing to wait for.
                self._named = report.seq
                self._reachable(now)
                return
            if exc.retryable:
                # It answered: it is up and deciding (a 503 may be its munged); try
                # again later, but this is no outage to self-drain for.
                self._failed(now, str(exc))
                self._down_since = None
                return
            # The controller refused this report: sending it again at once would be
            # refused again; try the full report at the heartbeat cadence.
            self._set_state("rejected", f"controller refused the report from {self.node}: {exc}")
            self._reachable(now)
            self._sent, self._resend = fp, True
            self._retry_at = now + self.config.heartbeat_interval_s
            return
        except (ControllerUnreachable, AuthError) as exc:
            self._failed(now, str(exc))
            return
        if full:
            self._sent, self._resend = fp, False
            self._sent_progress, self._last_full = report.progress, now
        self._named = report.seq
        self._reachable(now)
        self._set_state("ok", f"reporting to controller at {self._client.url}")

    def _reachable(self, now: float) -> None:
        self._last_send = now
        self._attempt = 0
        self._retry_at = 0.0
        self._down_since = None

    def _failed(self, now: float, why: str) -> None:
        if self._down_since is None:
            self._down_since = now
        # The controller may have restarted and lost our state: resend in full.
        self._resend = True
        self._retry_at = now + self._backoff()
        self._attempt += 1
        self._set_state("unreachable", f"cannot report to the controller: {why}")

    def _backoff(self) -> float:
        cfg = self.config
        base = min(cfg.backoff_max_s, cfg.backoff_initial_s * 2.0 ** min(self._attempt, 30))
        spread = base * cfg.backoff_jitter
        return max(0.0, min(cfg.backoff_max_s, base + self._rng.uniform(-spread, spread)))

    def _set_state(self, state: str, message: str) -> None:
        if state == self._state:
            return
        self._state = state
        log.log(logging.INFO if state == "ok" else logging.WARNING, "%s", message)
