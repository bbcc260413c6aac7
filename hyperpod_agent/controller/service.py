"""The controller service: the level-triggered reconcile loop (its inputs: ingest.py).

Each pass re-reads Slurm, finishes open intents, asks the pure policy what to do and
lets the executor do it. A fault report wakes the loop at once. Slurm errors never
end the loop: they are logged, counted and retried on the next pass.

With ``[ha]`` only the leader passes (leadership.py); a standby stores what agents
send and serves the API. The leader's intents are fenced with its lease: one lost
during a pass ends the pass, and the next leader's first pass finishes the open
intents as a restarted controller does.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from hyperpod_agent.controller import metrics
from hyperpod_agent.controller.actions import Executor
from hyperpod_agent.controller.autoresume import cap_of
from hyperpod_agent.controller.config import ControllerConfig, load_config
from hyperpod_agent.controller.crash import crash_from_env
from hyperpod_agent.controller.deepcheck.run import CheckRunner
from hyperpod_agent.controller.gate import Gate
from hyperpod_agent.controller.gather import gather
from hyperpod_agent.controller.ingest import Heartbeat, Ingest
from hyperpod_agent.controller.isolation import Isolation
from hyperpod_agent.controller.jobwatch import JobWatch
from hyperpod_agent.controller.leadership import Leadership
from hyperpod_agent.controller.policy import decide
from hyperpod_agent.controller.providers.base import Provider, ProviderError, SlurmApi
from hyperpod_agent.controller.replacement import SparePool
from hyperpod_agent.controller.snapshot import Decision, Kind, PlannedAction, Snapshot
from hyperpod_agent.controller.stepretry.run import StepRetryRunner
from hyperpod_agent.controller.store.facade import Store
from hyperpod_agent.controller.store.lease import Lease, LeaseLost
from hyperpod_agent.controller.store.rows import TrackedJob
from hyperpod_agent.errors import ConfigError, SlurmError
from hyperpod_agent.reasons import Owner, Verb, format_reason, owner_of
from hyperpod_agent.slurm.models import Job, Node

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 3600.0
ENDED = ("COMPLETED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "DEADLINE", "PREEMPTED")


class Controller(Ingest):
    """Owns the store, the Slurm view and the loop; the API calls into it."""

    def __init__(
        self,
        config: ControllerConfig,
        store: Store,
        slurm: SlurmApi,
        provider: Provider,
        config_path: Path | None = None,
        clock: Callable[[], float] = time.time,
        leadership: Leadership | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.store = store
        self.slurm = slurm
        self.provider = provider
        self.clock = clock
        # Every change to Slurm goes through the gate (owner rule, lease, log).
        self.gate = (
            slurm
            if isinstance(slurm, Gate)
            else Gate(
                slurm,
                slurm_users=(config.slurm_user,),
                store=store,
                leadership=leadership,
                clock=clock,
                margin_s=config.ha.clock_margin_s,
            )
        )
        self.gate.observe = config.policy.observe
        # node -> the release its agent's requests name (User-Agent), for `hyperpod version`
        self.agent_versions: dict[str, str] = {}
        self.executor = Executor(store, self.gate, provider, config)
        # One bad item (job, intent, check run, surgery) never stops a pass.
        self.isolation = Isolation(store.add_event, clock)
        self.executor.isolation = self.isolation
        self.wake = threading.Event()
        self.leadership = leadership
        if leadership is None:
            metrics.LEADER.set_function(lambda: 1.0)
        elif leadership.on_change is None:
            leadership.on_change = self.wake.set  # a new leader passes at once
        self.started_at = clock()
        store.fence_clock = clock  # a fence is judged when written, not at pass start
        self.nodes: dict[str, Node] = {}
        self.jobs: list[Job] = []
        self.last_pass_at: float | None = None
        self.incident_reason = ""
        self._beats: dict[str, Heartbeat] = {}
        self._pending_beats: dict[str, tuple[str, int, float]] = {}
        self._ingest_lock = threading.Lock()
        self._config_mtime = _mtime(config_path)
        self._last_events: set[str] = set()
        self._pruned_at = 0.0
        self.watch = JobWatch(store)
        self.checks = CheckRunner(
            store,
            self.gate,
            config.deep_checks,
            (config.slurm_user,),
            self._escalate,
            isolation=self.isolation,
        )
        # the same test-only hook as the executor's, at "step_retry:<phase>" (done)
        self.steps = StepRetryRunner(
            store,
            self.gate,
            config,
            crash_hook=lambda phase: crash_from_env(f"step_retry:{phase}"),
            isolation=self.isolation,
        )
        # Held from the snapshot to the executor's last action of a pass, and while a
        # step retry is decided and recorded: the policy never plans against a view
        # that misses a surgery, nor a surgery against a pass's half-applied plan.
        self.plan_lock = threading.Lock()
        for name, row in store.node_rows().items():
            if row.hb_agent_id is not None and row.hb_seq is not None:
                self._beats[name] = Heartbeat(
                    name, row.hb_agent_id, row.hb_seq, row.heartbeat_at or 0.0
                )

    # -- ingest ---------------------------------------------------------------------
    # -- the loop -------------------------------------------------------------------
    def _reload_config(self) -> None:
        mtime = _mtime(self.config_path)
        if self.config_path is None or mtime == self._config_mtime:
            return
        self._config_mtime = mtime
        try:
            new = load_config(self.config_path)
        except ConfigError as exc:
            log.error("config reload failed, keeping the last good one: %s", exc)
            self.store.add_event("config_error", str(exc), self.clock())
            return
        for key in ("listen_host", "listen_port", "state_db", "auth", "max_body_bytes", "ha"):
            if getattr(new, key) != getattr(self.config, key):
                log.warning("config: %s changed; takes effect after a restart", key)
        if new.policy.observe != self.config.policy.observe:
            mode = "observe" if new.policy.observe else "act"
            self.store.add_event("mode", f"config: mode is now {mode!r}", self.clock())
            log.warning("config: mode is now %r", mode)
        self.gate.observe = new.policy.observe
        self.config = new
        self.executor.config = new
        self.checks.deep = new.deep_checks
        self.steps.config = new
        log.info("config reloaded from %s", self.config_path)

    def snapshot(self, nodes: Mapping[str, Node], jobs: Sequence[Job], now: float) -> Snapshot:
        """Everything the policy needs, from the store and this pass's Slurm view."""
        snap = gather(self.store, self.config, self._beats, self.started_at, nodes, jobs, now)
        return dataclasses.replace(snap, expansion_refused=self.gate.expansion.refusal())

    def replacement_params(self, node: str) -> dict[str, Any]:
        """What an admin's replace of ``node`` needs from the provider: with the spare
        pool, a spare that is ready (healthy, recent, not promised elsewhere).

        Raises ProviderError when there is none."""
        params: dict[str, Any] = {}
        failed = self.nodes.get(node)
        if self.config.provider.kind == "spare_pool" and failed is not None:
            now = self.clock()
            snap = self.snapshot(self.nodes, self.jobs, now)
            pool = SparePool(snap, self.config.policy, now, self.config.deep_checks)
            spare = pool.take(failed)
            params = {"spare": spare} if spare else {"no_spare": pool.why_none(failed)}
        return self.provider.prepare(node, self.nodes, params)

    def _escalate(self, node: str, check: str, cause: str) -> None:
        """A node that failed its deep check after a reboot or repair: replaced, as a
        fault that came back after its remedy is (the node stays held meanwhile)."""
        now = self.clock()
        try:
            params = self.replacement_params(node)
        except ProviderError as exc:
            params = {"no_spare": str(exc)}
        reason = format_reason(Verb.REPLACE, "deep-check", check, cause)
        action = PlannedAction(Kind.REPLACE, node, reason, cause, params=params)
        try:  # the node as it is now (held by the run), not as this pass began
            nodes = {n.name: n for n in self.slurm.list_nodes()}
        except SlurmError as exc:
            log.warning("replace %s after its failed deep check: %s (it stays held)", node, exc)
            return
        current = nodes.get(node)
        if current is None or owner_of(current, (self.config.slurm_user,)) is Owner.OTHER:
            # Somebody drained it during the check: theirs now, not a replacement's.
            why = "not in Slurm" if current is None else f"its reason is {current.reason!r}"
            self.store.add_event(
                "deep_check_left", f"{node} not replaced after {check}: {why}", now, node=node
            )
            return
        self.executor.execute(Decision([action]), nodes, self.jobs, now)

    def _track_jobs(self, snap: Snapshot, now: float) -> None:
        """Remember opted-in jobs (for the API) and close the ones that ended well."""
        for job in snap.jobs:
            self.isolation.run(
                "job", job.job_id, partial(self._track_job, job, snap, now), None, job_id=job.job_id
            )

    def _track_job(self, job: Job, snap: Snapshot, now: float) -> None:
        cap = cap_of(job, snap, self.config.auto_resume.default_attempts)
        tracked = snap.tracked.get(job.job_id)
        if cap is None:
            return
        if tracked is None:
            self.store.upsert_job(TrackedJob(job.job_id, cap, updated_at=now))
        elif job.state.upper() in ENDED and tracked.state not in ("done", "exhausted"):
            self.store.upsert_job(dataclasses.replace(tracked, state="done", updated_at=now))

    # -- leader and standby ---------------------------------------------------------
    def role(self) -> str:
        """``single`` without [ha]; else ``leader`` or ``standby``."""
        if self.leadership is None:
            return "single"
        return "leader" if self.leadership.is_leader() else "standby"

    def leader(self) -> tuple[str | None, float | None]:
        """Which controller leads (its id) and since when, as far as this one knows."""
        if self.leadership is None:
            return self.config.controller_id(), self.started_at
        current = self.leadership.leader()
        return current if current is not None else (None, None)

    def require_leader(self) -> Lease | None:
        """The lease an admin write is fenced with (None without [ha]); a standby
        refuses the write (503 ``not_leader``)."""
        if self.leadership is None:
            return None
        lease = self.leadership.lease()
        if lease is None:
            raise self.leadership.not_leader()
        return lease

    def reconcile_once(self) -> Decision | None:
        """One pass. Returns the decision; None when Slurm could not be read, on a
        standby, or when the lease was lost during the pass."""
        if self.leadership is None:
            return self._pass()
        lease = self.leadership.lease()
        if lease is None:
            # A standby stores what agents sent it; it touches neither Slurm nor a provider.
            self._reload_config()
            self._flush_heartbeats()
            return None
        self.executor.fence = self.steps.fence = self.checks.fence = lease
        crash_from_env("lease_checked")
        try:
            return self._pass()
        except LeaseLost as exc:
            log.warning("lease lost during a pass; this controller stops acting: %s", exc)
            metrics.PASSES.labels("lease_lost").inc()
            self.leadership.drop(str(exc))
            return None
        finally:
            self.executor.fence = self.steps.fence = self.checks.fence = None

    def _pass(self) -> Decision | None:
        started = time.monotonic()
        self._reload_config()
        now = self.clock()
        self._flush_heartbeats()
        try:
            nodes = {n.name: n for n in self.slurm.list_nodes()}
            jobs = self.slurm.list_jobs()
        except SlurmError as exc:
            log.error("reading Slurm failed (retrying next pass): %s", exc)
            metrics.PASSES.labels("slurm_error").inc()
            return None
        changed = self.executor.process_open(nodes, jobs, now)
        changed += self.checks.advance(nodes, jobs, now)
        if self.steps.advance(now, jobs):
            changed += 1
            self.wake.set()  # a rolled-back surgery's requeue intent: the next pass applies it
        if changed:
            try:  # decide on what Slurm looks like now, not before those actions
                nodes = {n.name: n for n in self.slurm.list_nodes()}
                jobs = self.slurm.list_jobs()
            except SlurmError as exc:
                log.error("re-reading Slurm failed (retrying next pass): %s", exc)
                metrics.PASSES.labels("slurm_error").inc()
                return None
        with self.plan_lock:
            snap = self.snapshot(nodes, jobs, now)
            self.watch.settle(jobs, now)
            self._track_jobs(snap, now)
            root = self.config.auto_resume.checkpoint_root
            if root is not None:
                self.watch.read_markers(snap, root, self.config.auto_resume.default_attempts, now)
            decision = decide(snap, self.config, now, self.hang_memory)
            for ev in decision.events:  # a node or job the policy had to skip
                if ev.kind == "policy_error":
                    metrics.PASS_ITEM_ERRORS.labels(
                        "job" if ev.job_id is not None else "node"
                    ).inc()
            decision = self._dedupe(decision, now)
            acted = self.executor.execute(decision, nodes, jobs, now)
        if acted:
            nodes, jobs = self._reread(nodes, jobs)  # so the API shows what we just did
        if any(a.kind is Kind.CHECK for a in decision.actions):
            # start the runs just planned now, not a pass later
            if self.checks.advance(nodes, jobs, now):
                nodes, jobs = self._reread(nodes, jobs)
        self.nodes, self.jobs, self.last_pass_at = nodes, jobs, now
        self._gauges(nodes, snap)
        if now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = now
            self.store.prune_step_watches(now)
            removed = self.store.prune(now - self.config.history_retention_s)
            if removed:
                log.info(
                    "pruned %d history rows older than %.0f s",
                    removed,
                    self.config.history_retention_s,
                )
        metrics.PASSES.labels("ok").inc()
        metrics.PASS_SECONDS.observe(time.monotonic() - started)
        return decision

    def _reread(self, nodes: dict[str, Node], jobs: list[Job]) -> tuple[dict[str, Node], list[Job]]:
        try:
            return {n.name: n for n in self.slurm.list_nodes()}, self.slurm.list_jobs()
        except SlurmError as exc:
            log.warning("re-reading Slurm after actions failed: %s", exc)
            return nodes, jobs

    def _dedupe(self, decision: Decision, now: float) -> Decision:
        """Say each alert once, not on every pass while it holds."""
        if not decision.incident and self.incident_reason:
            self.store.add_event("incident_over", "incident mode over: automation resumes", now)
        self.incident_reason = decision.incident_reason if decision.incident else ""
        metrics.INCIDENT.set(1 if decision.incident else 0)
        metrics.HUNG_JOBS.set(decision.hung_jobs)
        fresh = [
            e
            for e in decision.events
            if e.message not in self._last_events
            and not (e.kind == "incident" and self._was_incident(e.message))
        ]
        self._last_events = {e.message for e in decision.events}
        return dataclasses.replace(decision, events=fresh)

    def _was_incident(self, message: str) -> bool:
        return any(m.startswith("incident mode:") for m in self._last_events)

    def _gauges(self, nodes: Mapping[str, Node], snap: Snapshot) -> None:
        metrics.NODES.clear()
        for node in nodes.values():
            state = node.state + ("+DRAIN" if "DRAIN" in node.flags else "")
            metrics.NODES.labels(state).inc()
        metrics.NODES_HEALTH.clear()
        for name in nodes:
            h = snap.health.get(name)
            verdict = h.verdict.value if h and h.verdict else "unknown"
            metrics.NODES_HEALTH.labels(verdict).inc()

    def run(self, stop: threading.Event, alive: Callable[[], None] | None = None) -> None:
        """Reconcile until ``stop`` is set; never dies on an error of one pass.

        ``alive`` is called after every pass (the systemd watchdog ping), and while a
        long provider command runs.
        """
        self.executor.keepalive = self.gate.keepalive = alive
        while not stop.is_set():
            try:
                self.reconcile_once()
            except Exception:
                # A bug in one pass must not stop remediation for the whole cluster;
                # it is logged with its traceback and counted.
                log.exception("reconcile pass failed")
                metrics.PASSES.labels("error").inc()
            if alive is not None:
                alive()
            self.wake.wait(self.next_wait())
            self.wake.clear()


def _mtime(path: Path | None) -> float | None:
    if path is None:
        return None
    try:
        return path.stat().st_mtime
    except OSError:
        return None
