"""The end of a chaos campaign (bench/chaos.py): read what the checker needs (the
product's event log page by page, slurmctld's log, the jobs' outputs), keep it as JSON,
judge it (bench/chaos_check.py) and write the report, with the simulator's prediction
beside a one-job workload's measured goodput. Also the one way the driver runs a
command on the campaign's cluster."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from bench.chaos_check import Evidence, Limits, check_campaign, summarize
from bench.chaos_evidence import Event, TrainOutput
from bench.chaos_measure import recoveries, workload_goodput
from bench.chaos_parse import ctld_actions, parse_ctld_log, parse_events, parse_train_output
from bench.chaos_predict import measured_ettr, predict
from hyperpod_agent.controller.config import load_config
from hyperpod_agent.localcluster.cluster import LocalCluster
from hyperpod_agent.simulate.result import Strategy

if TYPE_CHECKING:
    from bench.chaos import Campaign

HYPERPOD = (sys.executable, "-m", "hyperpod_agent")


def run(cluster: LocalCluster, *argv: str, timeout: float = 20.0) -> str:
    """A command's output; its error said on stderr when it failed."""
    env = {**cluster.env, "HYPERPOD_LOCAL_CLUSTER_DIR": str(cluster.dir)}
    res = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if res.returncode != 0:
        print(
            f"  {' '.join(argv[:4])}: rc {res.returncode}: {res.stderr.strip()[:300]}", flush=True
        )
    return res.stdout


def read_events(cluster: LocalCluster, since: float) -> list[Event]:
    """The product's event log since ``since``, page by page (the API gives 1000 at
    most, oldest first; pages overlap by a timestamp and are joined by id)."""
    found: dict[int, Event] = {}
    after = since
    for _ in range(100):  # bounded: 100,000 events
        iso = datetime.fromtimestamp(after, UTC).isoformat()
        text = run(cluster, *HYPERPOD, "events", "--since", iso, "--limit", "1000", "--json")
        page = parse_events(text)
        new = [e for e in page if e.id not in found]
        found.update((e.id, e) for e in page)
        if len(page) < 1000 or not new:
            break
        after = max(e.at for e in page)
    return sorted(found.values(), key=lambda e: e.id)


def judge(c: Campaign, args: argparse.Namespace) -> tuple[str, int]:
    """The campaign's report, and how many violations it found."""
    cluster = c.cluster
    config = load_config(cluster.services.controller_config_path(cluster.services.controllers[0]))
    size = len(cluster.nodes) + len(cluster.spares)
    policy = config.policy
    max_out = max(policy.min_unhealthy_nodes, math.floor(policy.max_unhealthy_fraction * size))
    events = read_events(cluster, c.t0)
    log = (cluster.dir / "log" / "slurmctld.log").read_text(errors="replace")
    ctld = [a for a in ctld_actions(parse_ctld_log(log)) if a.t >= c.t0]
    outputs = {j: parse_train_output(p.read_text()) for j, p in c.outputs.items() if p.exists()}
    evidence = Evidence(
        nodes=c.nodes,
        jobs=c.jobs,
        reservations=c.reservations,
        ctld=ctld,
        injections=c.injections,
        admin=c.admin,
        processes=c.processes,
        events=events,
        status=c.status,
        outputs=outputs,
        auto_resume_jobs=frozenset(c.auto_resume),
        spares=frozenset(cluster.spares),
    )
    limits = Limits(max_out=max_out, reconcile_interval_s=config.reconcile_interval_s, ckpt_every=5)
    keep_evidence(cluster.dir / "evidence.json", evidence)
    violations = check_campaign(evidence, limits)
    report = summarize(
        c.injections,
        recoveries(c.injections, c.jobs, outputs),
        violations,
        seed=args.seed,
        minutes=args.minutes,
        rate=args.rate,
        goodput=workload_goodput(outputs),
        command=".venv/bin/python bench/chaos.py"
        + (" --workload one-job" if c.one_job_steps else ""),
    )
    if c.one_job_steps:
        report += "\n" + beside_prediction(c, outputs)
    return report, len(violations)


def keep_evidence(path: Path, evidence: Evidence) -> None:
    """Everything the checker read, as JSON beside the cluster's logs: a campaign's
    findings can be read again (and the checker run again) after the cluster is down."""
    doc = dataclasses.asdict(evidence)
    path.write_text(
        json.dumps(doc, default=lambda o: sorted(o) if isinstance(o, frozenset) else str(o))
    )
    print(f"evidence: {path}", flush=True)


def beside_prediction(c: Campaign, outputs: dict[int, TrainOutput]) -> str:
    """The one job's measured goodput beside the simulator's, for its faults."""
    lines = ["", "the one job's goodput, measured and as the simulator predicts it:"]
    for job_id, out in outputs.items():
        measured = measured_ettr(out)
        size, spares = len(c.cluster.nodes), len(c.cluster.spares)
        for strategy in (Strategy.STEP_RETRY, Strategy.REQUEUE):
            got = predict(c.injections, c.jobs, job_id, out, size, spares, 5, strategy, c.nodes)
            if got is None or measured is None:
                lines.append(f"  job {job_id}: too few steps to tell")
                break
            lines.append(
                f"  job {job_id} {strategy.value:<11} predicted ETTR {got.ettr:.3f} "
                f"({got.faults} node faults simulated); measured {measured:.3f}"
            )
    return "\n".join(lines)
