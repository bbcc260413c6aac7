"""The node health agent: probes -> verdict -> cache, metrics and the controller.

One loop, one cycle every ``cycle_s``: start the probes that are due, wait (bounded)
for them, judge the latest result of every probe, read the training ranks' progress
records, write the cache atomically, publish the report, ping the systemd watchdog.
Nothing a probe does can stop the loop; the loop logs when the node's state or a
probe's status changes, not every cycle.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from hyperpod_agent.agent.cache import write_report
from hyperpod_agent.agent.config import AgentConfig
from hyperpod_agent.agent.janitor import MemoryTierJanitor, slurm_lookup
from hyperpod_agent.agent.markers import MarkerReader
from hyperpod_agent.agent.metrics import AgentMetrics
from hyperpod_agent.agent.progress_janitor import ProgressJanitor
from hyperpod_agent.agent.progress_reader import ProgressReader
from hyperpod_agent.agent.verdict import NodeVerdict, VerdictConfig, VerdictEngine
from hyperpod_agent.errors import HyperpodError
from hyperpod_agent.health import JobProgress, NodeReport, Status, Verdict
from hyperpod_agent.probes.base import Outcome, Probe, ProbeConfig
from hyperpod_agent.probes.registry import PROBES
from hyperpod_agent.probes.runner import ProbeRunner
from hyperpod_agent.sdnotify import sd_notify

log = logging.getLogger(__name__)


class _BrokenProbe(Probe[ProbeConfig]):
    """Stands in for a probe whose constructor raised: reports UNKNOWN forever."""

    name = "broken"
    config_model = ProbeConfig

    def __init__(self, config: ProbeConfig, reason: str) -> None:
        self.config = config
        self.reason = reason

    def check(self) -> Outcome:
        return Outcome(Status.UNKNOWN, self.reason)


def build_probes(config: AgentConfig) -> dict[str, Probe[ProbeConfig]]:
    """One instance of every enabled probe. A constructor that raises yields a probe
    that reports UNKNOWN with the reason instead of stopping the agent."""
    context = config.probe_context()
    probes: dict[str, Probe[ProbeConfig]] = {}
    for name, cfg in config.enabled_probes().items():
        try:
            probes[name] = PROBES[name](cfg, context)
        except Exception as exc:  # noqa: BLE001 - one bad probe must not stop the rest
            log.error("probe %s failed to start: %s", name, exc)
            probes[name] = _BrokenProbe(cfg, f"failed to start: {type(exc).__name__}: {exc}")
    return probes


def make_reporter(config: AgentConfig) -> Any:
    """The controller reporter, or None when no controller is configured or the
    reporter is not available in this build."""
    if not config.controller.controller_urls():
        return None
    from hyperpod_agent.agent import reporter as reporter_module

    cls = getattr(reporter_module, "Reporter", None)
    if cls is None:
        log.warning("controller configured but this build has no reporter; not reporting")
        return None
    return cls(
        config.controller,
        config.node_name,
        progress_interval_s=config.effective_progress_report_interval_s(),
    )


class Agent:
    """The agent's state between cycles."""

    def __init__(self, config: AgentConfig, reporter: Any = None) -> None:
        self.config = config
        self.agent_id = uuid.uuid4().hex[:16]
        self.seq = 0
        self.metrics = AgentMetrics()
        self.probes = build_probes(config)
        gpu = self.probes.get("gpu")
        if gpu is not None and hasattr(gpu, "xid_counts"):
            self.metrics.set_xid_source(lambda: dict(gpu.xid_counts))
        self.runner = ProbeRunner(self.probes, observer=self._observe)
        self.engine = VerdictEngine(config.verdict, started=time.monotonic())
        self.reporter = reporter
        if hasattr(reporter, "count_would_have"):
            reporter.count_would_have(lambda action: self.metrics.would_have.labels(action).inc())
        self.stopping = threading.Event()
        self._last_state: tuple[str, str, str] | None = None
        self._probe_status: dict[str, Status] = {}
        self.markers = (
            MarkerReader(config.auto_resume_markers, config.node_name)
            if config.auto_resume_markers is not None
            else None
        )
        self.janitor = MemoryTierJanitor(
            config.memory_tier,
            slurm_lookup(config.slurm_conf),
            on_removed=lambda _job: self.metrics.memory_tiers_freed.inc(),
        )
        self.progress = ProgressReader(
            config.progress_dir,
            stale_s=config.progress_stale_s,
            procfs=config.procfs_root,
            on_skip=lambda reason: self.metrics.progress_skipped.labels(reason).inc(),
        )
        self._progress_error: str | None = None
        self.progress_janitor = ProgressJanitor(
            config.progress_dir, stale_s=config.progress_stale_s, procfs=config.procfs_root
        )

    def _observe(self, result: Any, ran: bool) -> None:
        self.metrics.observe(result, ran)
        if self._probe_status.get(result.probe) != result.status:
            self._probe_status[result.probe] = result.status
            level = logging.INFO if result.status == Status.OK else logging.WARNING
            log.log(level, "probe %s: %s %s", result.probe, result.status.value, result.message)

    def _report(self, nv: NodeVerdict) -> NodeReport:
        self.seq += 1
        results = [self.runner.latest[n] for n in self.runner.names if n in self.runner.latest]
        return NodeReport(
            node=self.config.node_name,
            agent_id=self.agent_id,
            seq=self.seq,
            generated_at=datetime.now(UTC),
            verdict=nv.verdict,
            action=nv.action,
            urgent=nv.urgent,
            message=nv.message,
            results=results,
            confirmed=nv.confirmed,
            jobs_opted_in=self.markers.jobs() if self.markers is not None else {},
            progress=self._read_progress(),
        )

    def _read_progress(self) -> list[JobProgress]:
        """This cycle's progress; a failure costs the report its progress, nothing else,
        and is logged when it starts or changes, not every cycle."""
        try:
            jobs = self.progress.read()
        except Exception as exc:  # noqa: BLE001 - the health report must go out regardless
            why = f"{type(exc).__name__}: {exc}"
            if why != self._progress_error:
                log.exception(
                    "progress records in %s: couldn't read them: %s", self.progress.root, why
                )
                self._progress_error = why
            return []
        if self._progress_error is not None:
            log.info("progress records in %s: readable again", self.progress.root)
            self._progress_error = None
        return jobs

    def finish_cycle(self) -> NodeReport:
        """Judge the latest results, write the cache, update metrics, publish."""
        nv = self.engine.evaluate(
            [self.runner.latest[n] for n in self.runner.names if n in self.runner.latest],
            time.monotonic(),
        )
        report = self._report(nv)
        state = (nv.verdict.value, nv.action.value, nv.message)
        if state != self._last_state:
            level = logging.INFO if nv.verdict == Verdict.HEALTHY else logging.WARNING
            log.log(
                level,
                "node %s %s action=%s%s: %s",
                self.config.node_name,
                nv.verdict.value,
                nv.action.value,
                " urgent" if nv.urgent else "",
                nv.message,
            )
            self._last_state = state
        try:
            write_report(self.config.cache_path, report)
        except OSError as exc:
            log.error("cannot write cache %s: %s", self.config.cache_path, exc)
        self.metrics.set_verdict(nv.verdict)
        if self.reporter is not None:
            try:
                self.reporter.publish(report)
            except Exception as exc:  # noqa: BLE001 - the controller being down is not fatal
                log.warning("report to controller failed: %s", exc)
        return report

    def run_once(self) -> NodeReport:
        """Run every probe once and judge without damping or grace (for ``--once``)."""
        self.engine = VerdictEngine(
            VerdictConfig(fail_after_runs=1, grace_s=0.0), started=time.monotonic()
        )
        self.runner.run_once()
        return self.finish_cycle()

    def run(self) -> None:
        """Run cycles until ``stopping`` is set (SIGTERM/SIGINT)."""
        cycle_s = self.config.effective_cycle_s()
        if self.config.metrics.enabled:
            m = self.config.metrics
            try:
                self.metrics.serve(m.address, m.port)
            except OSError as exc:
                # Exit with one line; systemd restarts us once the port is free.
                raise HyperpodError(
                    f"metrics: cannot listen on {m.address}:{m.port}: {exc.strerror or exc}"
                ) from None
        log.info(
            "agent %s on %s: %d probes (%s), cycle %gs, cache %s",
            self.agent_id,
            self.config.node_name,
            len(self.probes),
            ", ".join(self.probes),
            cycle_s,
            self.config.cache_path,
        )
        # Before any job of this boot creates its memory tier or its progress records.
        self.janitor.prepare_root()
        self.progress_janitor.prepare_root()
        next_cycle = time.monotonic()
        ready = False
        while not self.stopping.is_set():
            # Wait for this cycle's probes for most of the cycle, then judge.
            try:
                self.runner.cycle(max_wait=max(0.0, next_cycle + 0.8 * cycle_s - time.monotonic()))
                self.finish_cycle()
                self.janitor.start_if_due()
                self.progress_janitor.maybe_sweep()  # no Slurm call: cheap and bounded
            except Exception:  # noqa: BLE001 - the agent outlives its own bugs; logged
                log.exception("cycle failed; continuing")
            sd_notify("WATCHDOG=1" if ready else "READY=1")
            ready = True
            next_cycle += cycle_s
            now = time.monotonic()
            if next_cycle < now:  # overran: skip ahead instead of bursting
                next_cycle = now + cycle_s / 2
            self.stopping.wait(max(0.0, next_cycle - now))

    def close(self) -> None:
        """Stop serving and release probes and the reporter."""
        sd_notify("STOPPING=1")
        self.metrics.stop()
        self.runner.close()
        close = getattr(self.reporter, "close", None)
        if callable(close):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                log.warning("reporter close failed: %s", exc)


def install_signal_handlers(agent: Agent) -> None:
    """SIGTERM and SIGINT end the loop after the current cycle."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        agent.stopping.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
