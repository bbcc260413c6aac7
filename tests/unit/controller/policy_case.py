"""The cases the policy's property tests judge: a snapshot, a config from a small
product of the settings that change what the policy does, and whose each node was made
to be (``Case.roles``), with a compact listing for a failing example; and how to read a
snapshot in the docs' words (out, busy, ours), without the code under test's helpers.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ctl_helpers import NOW, config

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.snapshot import Kind, NodeHealth, PlannedAction, Snapshot
from hyperpod_agent.health import JobProgress, RankProgress
from hyperpod_agent.slurm.models import Node

SLURM_USER = "slurm"
SPARE_REASON = "hyperpod:spare"
OURS = "hyperpod:"
REBOOT_FLAGS = {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"}
WATCH_GRACE_S = 60.0  # docs/auto-resume.md: a step told to end has 60 s to ask for its retry


@dataclass(frozen=True)
class Case:
    snap: Snapshot
    config: ControllerConfig
    roles: Mapping[str, str]  # node -> Role.who, as the strategy made it

    def __repr__(self) -> str:
        return describe(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(describe(self))  # how hypothesis shows a failing example


def describe(case: Case) -> str:
    """A compact listing of the case, for a failing example."""
    s, c = case.snap, case.config
    auto = c.auto_resume.enabled and c.auto_resume.retry_on
    lines = [
        f"Case(fraction={c.policy.max_unhealthy_fraction} min={c.policy.min_unhealthy_nodes} "
        f"shared={c.policy.shared_cause_window_s} lemon={c.policy.lemon_threshold} "
        f"provider={c.provider.kind} auto_resume={auto} "
        f"suspect={c.progress.suspect_action} gates={c.deep_checks.reentry_gate_on}"
    ]
    for n in s.nodes.values():
        h = s.health.get(n.name)
        boot = _ago(n.boot_time.timestamp()) if n.boot_time else "-"
        seen = f"{h.verdict} gen={_ago(h.generated_at)} seen={_ago(h.last_seen)}" if h else "-"
        prog = [(p.job_id, r.step, _ago(r.step_at), r.proc_state, r.median_s)
                for p in (h.progress if h else ()) for r in p.ranks]  # fmt: skip
        lines.append(
            f"  {n.name} [{case.roles[n.name]}] {n.state} {sorted(n.flags)} {n.reason!r} "
            f"by={n.reason_user!r} parts={n.partitions} boot={boot} health={seen}"
            + (f" opted={dict(h.jobs_opted_in)}" if h and h.jobs_opted_in else "")
            + (f" progress={prog}" if prog else "")
        )
    lines += [
        f"  {'open' if f.closed_at is None else 'closed'} #{f.id} {f.node} {f.component} "
        f"{f.code} {f.action} urgent={f.urgent} first={_ago(f.first_seen)}"
        for f in s.history
    ]
    lines += [f"  done {a.kind} {a.node} at={_ago(a.updated_at)}" for a in s.done]
    lines += [f"  {a.state} {a.kind} {a.node or a.job_id} {a.params}" for a in s.in_flight]
    lines += [
        f"  job {j.job_id} {j.state} nodes={j.nodes} auto={j.auto_resume} "
        f"restarts={j.restart_count} -w={j.extra.get('required_nodes', '')!r} "
        f"tracked={s.tracked.get(j.job_id)}"
        for j in s.jobs
    ]
    outcomes = {k: (v.outcome, _ago(v.at)) for k, v in s.check_outcomes.items()}
    lines.append(
        f"  replaced={sorted(s.replaced)} checking={sorted(s.checking)} outcomes={outcomes} "
        f"step_retries={dict(s.step_retries)} watched={dict(s.watched_jobs)} "
        f"findings={[(f.kind, f.job_id, f.node) for f in s.findings]} "
        f"requeues_last_minute={s.requeues_last_minute})"
    )
    return "\n".join(lines)


def _ago(t: float | None) -> str:
    return "-" if t is None else f"now-{NOW - t:g}"


CONFIG_DIMS: list[tuple[str, list[Any]]] = [
    ("fraction", [0.34, 1.0, 0.1]),
    ("min_unhealthy", [1, 0, 2]),
    ("shared_window", [30.0, 0.0]),
    ("lemon_threshold", [5, 2]),
    ("provider", ["spare_pool", "command"]),
    ("auto_resume", ["node_fault", "any_failure", "off"]),
    ("progress", ["reboot", "drain", "none"]),
    ("deep", [False, True]),
]
CONFIG_COUNT = 1
for _, _values in CONFIG_DIMS:
    CONFIG_COUNT *= len(_values)


@functools.cache
def config_at(index: int) -> ControllerConfig:
    """The index-th config of the product of CONFIG_DIMS (0: the first of each)."""
    pick: dict[str, Any] = {}
    for name, values in reversed(CONFIG_DIMS):
        index, i = divmod(index, len(values))
        pick[name] = values[i]
    command = {"command": ["/bin/true"]} if pick["provider"] == "command" else {}
    auto = {"enabled": pick["auto_resume"] != "off"}
    auto |= {"retry_on": pick["auto_resume"]} if auto["enabled"] else {}
    quiet = pick["progress"] == "none"  # no suspect taken out: hold stragglers, cancel
    gates = {"suite": "/etc/hyperpod/deep-checks.toml"}  # with a suite the gates are on
    return config(
        slurm_user=SLURM_USER,  # type: ignore[arg-type]
        policy={
            "max_unhealthy_fraction": pick["fraction"],
            "min_unhealthy_nodes": pick["min_unhealthy"],
            "shared_cause_window_s": pick["shared_window"],
            "lemon_threshold": pick["lemon_threshold"],
        },
        provider={"kind": pick["provider"], **command},
        auto_resume=auto,
        progress={
            "suspect_action": pick["progress"],
            "straggler_hold_after_job": quiet,
            "cancel_unmanaged": quiet,
        },
        deep_checks=gates if pick["deep"] else {},
    )


@functools.cache
def _rank(rank: int, step: int, age: float, median: float, state: str) -> RankProgress:
    return RankProgress(
        rank=rank, pid=1000 + rank, step=step, step_at=NOW - age, window=30,
        median_s=median, p95_s=median, proc_state=state,
    )  # fmt: skip


def progress(mode: str, job_id: int, first: bool) -> JobProgress | None:
    """The job's progress on one of its nodes (``first``: the odd one out)."""
    if mode == "none":
        return None
    hung = mode.startswith("hung")
    step = 99 if mode == "hung_behind" and first else 100
    state = "D" if mode in ("hung_stuck", "hung_declared") and first else "S"
    median = 2.0 if mode == "straggler" and first else 1.0
    rank = _rank(0, step, 600.0 if hung else 1.0, median, state)
    return JobProgress(job_id=job_id, ranks=[rank])


def config_of(**choice: Any) -> ControllerConfig:
    """The config of CONFIG_DIMS with ``choice`` (name=value), the first value else."""
    index = 0
    for name, values in CONFIG_DIMS:
        index = index * len(values) + values.index(choice.get(name, values[0]))
    return config_at(index)


# -- what the snapshot says, in the docs' words ------------------------------------------
def drained(n: Node) -> bool:
    return bool({"DRAIN", "FAIL"} & n.flags) or n.state in ("DOWN", "FAIL")


def unavailable(n: Node) -> bool:
    """Out of service for any reason: drained by anyone, down, not responding."""
    return drained(n) or "NOT_RESPONDING" in n.flags


def not_responding(n: Node) -> bool:
    return "NOT_RESPONDING" in n.flags or n.state == "DOWN"


def our_verb(n: Node) -> str | None:
    """The verb of our reason on a drained node (``hyperpod:<verb> ...``), else None."""
    text = n.reason.strip()
    if not drained(n) or not text.startswith(OURS):
        return None
    return text[len(OURS) :].split(" ", 1)[0]


def current_report(s: Snapshot, name: str) -> NodeHealth | None:
    """The node's agent report, when it was made since the node last booted."""
    h, n = s.health.get(name), s.nodes[name]
    if h is None or h.generated_at is None:
        return None
    if n.boot_time is not None and h.generated_at < n.boot_time.timestamp():
        return None
    return h


def left_to_surgery(s: Snapshot) -> tuple[set[int], set[str]]:
    """(jobs, nodes) left to a step retry (docs/auto-resume.md): a surgery's job and its
    two nodes (the bad one, the spare); a watched step's running job (not told to end
    yet, or told less than WATCH_GRACE_S ago) and all its nodes."""
    live = {j.job_id: j.nodes for j in s.jobs if j.state == "RUNNING"}
    watched = {
        j for j, told in s.watched_jobs.items()
        if j in live and j not in s.step_retries and (told is None or NOW - told < WATCH_GRACE_S)
    }  # fmt: skip
    nodes = {n for pair in s.step_retries.values() for n in pair}
    nodes |= {n for j in watched for n in live[j]}
    return set(s.step_retries) | watched, nodes


def busy(s: Snapshot) -> set[str]:
    """Nodes something else is already doing something to: an open intent of ours, a
    deep check, a step retry, or Slurm rebooting them."""
    out = {a.node for a in s.in_flight if a.node} | set(s.checking)
    out |= left_to_surgery(s)[1]
    return out | {n.name for n in s.nodes.values() if n.flags & REBOOT_FLAGS}


def touched(a: PlannedAction) -> set[str]:
    """The nodes an action changes: its node, a check's nodes, the spare it brings in."""
    out = {a.node} if a.node and a.kind is not Kind.FINDING else set()
    if a.kind is Kind.CHECK:
        out |= set(a.params.get("nodes", ()))
    if a.params.get("spare"):
        out.add(str(a.params["spare"]))
    return out
