"""Every Prometheus metric the controller exports, in one registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hyperpod_agent import wire
from hyperpod_agent.controller.goodput.model import ClusterGoodput, JobGoodput
from hyperpod_agent.slurm.models import ENDED_STATES

REGISTRY = CollectorRegistry(auto_describe=True)

NODES = Gauge(
    "hyperpod_controller_nodes", "Slurm nodes by base state", ["state"], registry=REGISTRY
)
NODES_HEALTH = Gauge(
    "hyperpod_controller_nodes_health",
    "Nodes by latest agent verdict",
    ["verdict"],
    registry=REGISTRY,
)
FAULTS = Counter("hyperpod_faults_total", "Faults opened, by code", ["code"], registry=REGISTRY)
ACTIONS = Counter(
    "hyperpod_actions_total", "Actions by kind and outcome", ["kind", "outcome"], registry=REGISTRY
)
FAULT_TO_DRAIN = Histogram(
    "hyperpod_fault_to_drain_seconds",
    "From a fault first seen to the node taken out",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
INCIDENT = Gauge(
    "hyperpod_incident_mode", "1 while the blast-radius limit holds automation", registry=REGISTRY
)
REQUEUES = Counter("hyperpod_requeues_total", "Auto-resume job requeues", registry=REGISTRY)
REPORTS = Counter(
    "hyperpod_reports_total",
    "Agent messages by kind and outcome",
    ["kind", "outcome"],
    registry=REGISTRY,
)
PASSES = Counter(
    "hyperpod_controller_passes_total",
    "Reconcile passes by outcome",
    ["outcome"],
    registry=REGISTRY,
)
UNKNOWN_FIELDS = Counter(
    "hyperpod_api_unknown_fields_total",
    "Fields of a request this release does not know (a newer agent or CLI), ignored",
    ["model"],
    registry=REGISTRY,
)
wire.on_unknown_field(lambda model, _field: UNKNOWN_FIELDS.labels(model).inc())
WOULD_HAVE = Counter(
    "hyperpod_would_have_total",
    'Automatic actions decided but not taken in mode = "observe", by action',
    ["action"],
    registry=REGISTRY,
)
GATE_CALLS = Counter(
    "hyperpod_gate_calls_total",
    "Slurm-changing calls through the gate, by call and outcome "
    "(done, failed, refused, lease_lost, would_have)",
    ["call", "outcome"],
    registry=REGISTRY,
)
PASS_ITEM_ERRORS = Counter(
    "hyperpod_pass_item_errors_total",
    "Items (jobs, nodes, intents, check runs, surgeries) a pass skipped because handling "
    "them raised; the pass went on with the others",
    ["kind"],
    registry=REGISTRY,
)
LEADER = Gauge(
    "hyperpod_controller_leader",
    "1 while this controller leads (always 1 without [ha]), 0 on a standby",
    registry=REGISTRY,
)
PASS_SECONDS = Histogram(
    "hyperpod_controller_pass_seconds", "Duration of a reconcile pass", registry=REGISTRY
)
API_REJECTIONS = Counter(
    "hyperpod_api_rejections_total",
    "API requests refused, by error code",
    ["code"],
    registry=REGISTRY,
)
FINDINGS = Counter(
    "hyperpod_findings_total",
    "Hangs and stragglers declared, by kind",
    ["kind"],
    registry=REGISTRY,
)
HUNG_JOBS = Gauge(
    "hyperpod_jobs_hung",
    "Running jobs whose ranks made no progress past their limit",
    registry=REGISTRY,
)
HANG_IDLE = Histogram(
    "hyperpod_hang_idle_seconds",
    "How long a job had made no progress when its hang was declared",
    buckets=(5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600),
    registry=REGISTRY,
)
DEEP_CHECKS = Counter(
    "hyperpod_deep_checks_total",
    "Deep-check outcomes, one per node and run, by purpose (spare, reentry, admin)",
    ["purpose", "outcome"],
    registry=REGISTRY,
)
DEEP_CHECK_SECONDS = Histogram(
    "hyperpod_deep_check_seconds",
    "Deep-check runs: planned to done (reservation, job, restoring the nodes)",
    buckets=(10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400),
    registry=REGISTRY,
)
DEEP_CHECKS_RUNNING = Gauge(
    "hyperpod_deep_checks_running", "Deep-check runs under way", registry=REGISTRY
)
STEP_RETRIES = Counter(
    "hyperpod_step_retry_decisions_total",
    "Answers to failed auto-resume steps, by outcome (RETRYSTEP, REQUEUE, FAIL)",
    ["outcome"],
    registry=REGISTRY,
)
STEP_RETRY_PHASE_SECONDS = Histogram(
    "hyperpod_step_retry_phase_seconds",
    "Duration of each Slurm step of a step-retry surgery (drain, shrink, expand, absorb)",
    ["phase"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
    registry=REGISTRY,
)
STEP_RETRY_FAULT_SECONDS = Histogram(
    "hyperpod_step_retry_fault_seconds",
    "From the fault on the bad node (first seen) to its step's new node list ready",
    buckets=(1, 2, 3, 5, 10, 20, 30, 60, 120, 300),
    registry=REGISTRY,
)
STEP_RETRY_SECONDS = Histogram(
    "hyperpod_step_retry_seconds",
    "From a step's retry request to its surgery done (the new node list ready)",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
    registry=REGISTRY,
)
# Measured goodput over the last day (controller/goodput/), computed when /metrics is
# scraped, at most once a minute (controller/api/goodput.py).
GOODPUT_ETTR = Gauge(
    "hyperpod_goodput_ettr",
    "Share of the node time of the jobs the controller looks after that was productive, "
    "over the last day",
    registry=REGISTRY,
)
GOODPUT_LOST = Gauge(
    "hyperpod_goodput_lost_node_seconds",
    "Node-seconds those jobs lost over the last day, by cause (a cause not known from the "
    "records has no series)",
    ["cause"],
    registry=REGISTRY,
)
GOODPUT_JOB_ETTR = Gauge(
    "hyperpod_goodput_job_ettr",
    "A job's productive share of its wall time over the last day (jobs running or ended "
    "within the hour, at most 50)",
    ["job"],
    registry=REGISTRY,
)
GOODPUT_JOB_LOST = Gauge(
    "hyperpod_goodput_job_lost_seconds",
    "Seconds a job lost over the last day, by cause (the same jobs as hyperpod_goodput_job_ettr)",
    ["job", "cause"],
    registry=REGISTRY,
)
GOODPUT_SUCCESS = Gauge(
    "hyperpod_goodput_success",
    "1 when the last computation of the goodput gauges ran, 0 when it failed (see the log)",
    registry=REGISTRY,
)
GOODPUT_SECONDS = Gauge(
    "hyperpod_goodput_duration_seconds",
    "How long the last computation of the goodput gauges took",
    registry=REGISTRY,
)
# Per-job series: only jobs running now or ended this recently, the most lost first, at
# most this many, so the label set stays bounded whatever the cluster runs.
GOODPUT_RECENT_S = 3600.0
GOODPUT_MAX_JOBS = 50


def set_goodput(cluster: ClusterGoodput, now: float) -> None:
    """Set the goodput gauges from ``cluster``; the per-job series of jobs no longer
    shown go."""
    GOODPUT_ETTR.set(cluster.ettr if cluster.ettr is not None else float("nan"))
    GOODPUT_LOST.clear()
    for cause, lost in cluster.lost_node_s.items():
        if lost.seconds is not None:
            GOODPUT_LOST.labels(cause).set(lost.seconds)
    GOODPUT_JOB_ETTR.clear()
    GOODPUT_JOB_LOST.clear()
    for job in goodput_series(cluster, now):
        GOODPUT_JOB_ETTR.labels(str(job.job_id)).set(job.ettr or 0.0)
        for cause, lost in job.lost.items():
            if lost.seconds is not None:
                GOODPUT_JOB_LOST.labels(str(job.job_id), cause).set(lost.seconds)


def goodput_series(cluster: ClusterGoodput, now: float) -> list[JobGoodput]:
    """The jobs that get series: running, or ended within ``GOODPUT_RECENT_S``; the
    ones that lost most first, at most ``GOODPUT_MAX_JOBS``."""
    recent = [
        j
        for j in cluster.jobs
        if j.ettr is not None
        and (
            (j.state is not None and j.state not in ENDED_STATES)
            or (j.end is not None and j.end.timestamp() >= now - GOODPUT_RECENT_S)
        )
    ]
    recent.sort(key=lambda j: (j.productive_s - j.wall_s, j.job_id))
    return recent[:GOODPUT_MAX_JOBS]
