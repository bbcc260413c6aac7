"""The independent checker of a seeded chaos campaign (bench/chaos.py drives it).

Each invariant is a pure function of evidence records (bench/chaos_evidence.py) that
returns the violations it found, with evidence precise enough to debug: 1 to 5 in
bench/chaos_state_checks.py (what Slurm and the jobs show), 6 to 8 in
bench/chaos_records_checks.py (the product's records checked against those). Here:
all of them over one campaign, and its report. It trusts nothing
the product says about itself: the product's event log and status are checked against
Slurm's records, the driver's own records and the job output files. It imports no part of
the product's controller. bench/chaos.py puts the repository root on sys.path first.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench.chaos_evidence import (
    AdminAction,
    CtldAction,
    Event,
    Injection,
    JobSample,
    NodeSample,
    ProcessSample,
    Recovery,
    ReservationSweep,
    StatusSample,
    TrainOutput,
    Violation,
)
from bench.chaos_measure import Goodput
from bench.chaos_records_checks import actions_logged, one_leader, reconcile_liveness
from bench.chaos_state_checks import (
    REASON_KINDS,
    admin_untouched,
    auto_resume_outcomes,
    blast_radius,
    left_behind,
    training_outputs,
    ts,
)


# -- all of them, and the report ------------------------------------------------------------
@dataclass(frozen=True)
class Evidence:
    """Everything the driver collected (each record type says what it is)."""

    nodes: Sequence[NodeSample] = ()
    jobs: Sequence[JobSample] = ()
    reservations: Sequence[ReservationSweep] = ()
    ctld: Sequence[CtldAction] = ()
    injections: Sequence[Injection] = ()
    admin: Sequence[AdminAction] = ()
    processes: Sequence[ProcessSample] = ()
    events: Sequence[Event] = ()
    status: Sequence[StatusSample] = ()
    outputs: Mapping[int, TrainOutput] = field(default_factory=dict)
    auto_resume_jobs: frozenset[int] = frozenset()
    spares: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Limits:
    max_out: int
    reconcile_interval_s: float = 10.0
    window_s: float = 10.0
    settle_s: float = 300.0
    ckpt_every: Mapping[int, int] | int = 1
    reason_kinds: frozenset[str] = REASON_KINDS
    excused_jobs: frozenset[int] = frozenset()


def check_campaign(ev: Evidence, limits: Limits) -> list[Violation]:
    """Every invariant over the campaign's evidence; the violations in time order."""
    found = [
        *admin_untouched(ev.nodes, ev.admin, ev.reservations),
        *blast_radius(ev.nodes, limits.max_out, ev.admin),
        *training_outputs(ev.outputs, limits.ckpt_every),
        *auto_resume_outcomes(
            ev.jobs,
            ev.auto_resume_jobs,
            ev.events,
            limits.reason_kinds,
            limits.excused_jobs,
            ev.nodes,
        ),
        *left_behind(
            ev.jobs, ev.reservations, ev.nodes, ev.spares, ev.injections, ev.admin, limits.settle_s
        ),
        *actions_logged(
            ev.nodes,
            ev.jobs,
            ev.ctld,
            ev.events,
            ev.injections,
            ev.admin,
            limits.window_s,
            ev.processes,
        ),
        *one_leader(ev.processes, ev.events),
        *reconcile_liveness(ev.status, limits.reconcile_interval_s),
    ]
    return sorted(found, key=lambda v: (v.when, v.invariant))


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summarize(
    injections: Sequence[Injection],
    recoveries: Sequence[Recovery],
    violations: Sequence[Violation],
    *,
    seed: int,
    minutes: float,
    rate: float,
    command: str = ".venv/bin/python bench/chaos.py",
    goodput: Goodput | None = None,
) -> str:
    """The campaign's report: faults by kind, recoveries by kind (fault -> running again
    p50/p95/max, and how many never ran again), the violations with their evidence, and
    the command line that replays the campaign."""
    head = f"chaos campaign: {len(injections)} faults, {len(violations)} violations"
    lines = [head, "", "faults by kind:"]
    for kind, n in sorted(Counter(i.kind for i in injections).items()):
        lines.append(f"  {kind:<24} {n:>5}")
    lines += ["", "recoveries, fault -> running again (s):"]
    lines.append(f"  {'kind':<24} {'n':>5} {'never':>5} {'p50':>8} {'p95':>8} {'max':>8}")
    kinds: dict[str, list[Recovery]] = defaultdict(list)
    for r in recoveries:
        kinds[r.kind].append(r)
    for kind, rs in sorted(kinds.items()):
        took = [r.running_at - r.fault_at for r in rs if r.running_at is not None]
        cols = [f"{percentile(took, p):8.1f}" if took else f"{'-':>8}" for p in (50, 95, 100)]
        lines.append(f"  {kind:<24} {len(rs):>5} {len(rs) - len(took):>5} {' '.join(cols)}")
    if goodput is not None:
        lines += ["", f"workload effective training time: {goodput.ettr:.3f} "
                  f"({goodput.productive_s:.0f} s of steps in {goodput.wall_s:.0f} s of "
                  f"{goodput.jobs} training jobs' wall time)"]  # fmt: skip
    lines += ["", f"violations: {len(violations)}"]
    lines += [f"  [{v.invariant}] {ts(v.when)}: {v.evidence}" for v in violations]
    lines += ["", f"replay: {command} --seed {seed} --minutes {minutes:g} --rate {rate:g}"]
    return "\n".join(lines)
