"""The independent checker of a seeded chaos campaign (bench/chaos.py drives it).

Each invariant is a pure function of evidence records (bench/chaos_evidence.py) that
returns the violations it found, with evidence precise enough to debug. It trusts nothing
the product says about itself: the product's event log and status are checked against
Slurm's records, the driver's own records and the job output files. It imports no part of
the product's controller. bench/chaos.py puts the repository root on sys.path first.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

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

# The product's helper jobs and reservations (slurm/resize.py: hyperpod-expand-<job>;
# controller/deepcheck/job.py: hyperpod-check-<run>-<created>).
PRODUCT_NAME_PREFIXES = ("hyperpod-expand-", "hyperpod-check-")
# Event kinds that say why an auto-resume job was left alone (controller/records.py,
# stepretry/run.py, intent_log.py), and the names the brief gave them.
REASON_KINDS = frozenset(
    "budget_spent not_requeued step_retry_failed action_failed abandoned exhausted "
    "not_retried requeue_failed".split()
)
# Reasons for a passing cause: resumed by the product once the node is healthy.
PASSING = frozenset({"hyperpod:drain", "hyperpod:reset", "hyperpod:reboot", "hyperpod:check"})
# Event kinds that claim a change of a node in Slurm (the executor's node actions).
NODE_CLAIMS = frozenset({"drain", "hold", "replace", "reboot", "resume"})
Add = Callable[[float, str], None]


def ts(t: float) -> str:
    """``t`` as UTC ISO time with milliseconds (how the evidence names instants)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def _adder(found: list[Violation], invariant: str) -> Add:
    return lambda when, text: found.append(Violation(invariant, when, text))


def _series(samples: Iterable[NodeSample]) -> dict[str, list[NodeSample]]:
    out: dict[str, list[NodeSample]] = defaultdict(list)
    for s in sorted(samples, key=lambda s: s.t):
        out[s.node].append(s)
    return out


def _sweeps(samples: Iterable[NodeSample]) -> list[tuple[float, list[NodeSample]]]:
    out: dict[float, list[NodeSample]] = defaultdict(list)
    for s in samples:
        out[s.t].append(s)
    return sorted(out.items())


def _final(jobs: Iterable[JobSample]) -> dict[int, JobSample]:
    return {j.job_id: j for j in sorted(jobs, key=lambda j: j.t)}


def _held(admin: Iterable[AdminAction], t: float) -> set[str]:
    """The nodes out of service by the admin's own hand at ``t``."""
    return {a.node for a in admin if a.kind in ("drain", "reserve") and a.holds_at(t)}


def _near(t: float, lo: float, hi: float, slack: float) -> bool:
    return lo - slack <= t <= hi + slack


# -- 1 ------------------------------------------------------------------------------------
def admin_untouched(
    nodes: Sequence[NodeSample],
    admin: Sequence[AdminAction],
    reservations: Sequence[ReservationSweep] = (),
) -> list[Violation]:
    """A node the admin drained, resumed or reserved keeps the admin's state while it
    holds: no ``hyperpod:`` reason, not back in service before the admin resumed it, and
    the admin's reservation neither gone nor moved."""
    found: list[Violation] = []
    add = _adder(found, "admin_untouched")
    series = _series(nodes)
    for a in admin:
        what = f"admin {a.kind} of {a.node} at {ts(a.start)}"
        what += f" ({a.reason!r})" if a.reason else ""
        until = "the end" if a.end is None else ts(a.end)
        bad = [
            s
            for s in series.get(a.node, [])
            if a.holds_at(s.t) and (s.ours or (a.kind == "drain" and not s.out))
        ]
        if bad:
            why = "a product reason" if bad[0].ours else "back in service"
            add(bad[0].t, f"{what}, holding until {until}: {why} at {ts(bad[0].t)}: "
                f"{bad[0].show()} ({len(bad)} such samples)")  # fmt: skip
        made: frozenset[str] | None = None
        for sweep in reservations if a.kind == "reserve" else ():
            if not a.holds_at(sweep.t):
                continue
            mine = [frozenset(r.nodes) for r in sweep.reservations if r.name == a.reservation]
            made = made or (mine[0] if mine else None)
            if not mine or mine[0] != made:
                seen = f"now on {sorted(mine[0])}" if mine else "gone"
                add(sweep.t, f"{what}: reservation {a.reservation!r} {seen} at {ts(sweep.t)}")
                break
    return found


# -- 2 ------------------------------------------------------------------------------------
def blast_radius(
    nodes: Sequence[NodeSample], max_out: int, admin: Sequence[AdminAction] = ()
) -> list[Violation]:
    """At no sweep are more than ``max_out`` nodes out of service under a product reason
    (every take-out kind; the spare pool and the admin's own nodes not counted). One
    violation per run of consecutive sweeps over the limit, with its peak."""
    found: list[Violation] = []
    add = _adder(found, "blast_radius")
    run: list[tuple[float, list[NodeSample]]] = []

    def close() -> None:
        if run:
            peak_t, peak = max(run, key=lambda r: len(r[1]))
            add(run[0][0], f"{len(peak)} nodes out under product reasons at {ts(peak_t)} "
                f"(limit {max_out}); over it from {ts(run[0][0])} to {ts(run[-1][0])} "
                f"({len(run)} sweeps): " + "; ".join(s.show() for s in peak))  # fmt: skip
            run.clear()

    for t, sweep in _sweeps(nodes):
        held = _held(admin, t)
        out = [s for s in sweep if s.out and s.ours and not s.spare and s.node not in held]
        if len(out) > max_out:
            run.append((t, sorted(out, key=lambda s: s.node)))
        else:
            close()
    close()
    return found


# -- 3 ------------------------------------------------------------------------------------
def training_outputs(
    outputs: Mapping[int, TrainOutput], ckpt_every: Mapping[int, int] | int
) -> list[Violation]:
    """From each training job's output file: no two attempts run at once (an attempt's last
    line after the next one started, or steps out of sequence within one attempt: two
    copies writing), no resume further back than the checkpoint interval (``ckpt_every``,
    per job id or for all) allows, and every step 1..final printed."""
    found: list[Violation] = []
    add = _adder(found, "training")
    for job, out in sorted(outputs.items()):
        k = ckpt_every if isinstance(ckpt_every, int) else ckpt_every.get(job, 1)
        high: int | None = None  # the newest step an earlier attempt printed
        for prev, a in zip((None, *out.attempts), out.attempts, strict=False):
            where = f"job {job} attempt {a.number} on {a.nodes} (started {ts(a.started_at)})"
            if prev is not None and prev.last_at > a.started_at:
                add(a.started_at, f"{where} started while attempt {prev.number} on {prev.nodes} "
                    f"still ran: its last line at {ts(prev.last_at)}, "
                    f"{prev.last_at - a.started_at:.3f} s later")  # fmt: skip
            if a.start_step is not None and high is not None and a.start_step < high - k:
                add(
                    a.started_at,
                    f"{where} resumed from step {a.start_step} but step {high} "
                    f"was printed before: more than the checkpoint interval ({k}) lost",
                )
            expect = None if a.start_step is None else a.start_step + 1
            for step, at in a.steps:
                if expect is not None and step != expect:
                    add(at, f"{where}: step {step} at {ts(at)} where step {expect} was due "
                        "(two copies writing, or a lost line)")  # fmt: skip
                    break
                expect = step + 1
            high = max([s for s, _ in a.steps] + ([high] if high is not None else []), default=None)
        printed = set(out.steps)
        final = out.done_step if out.done_step is not None else max(printed, default=0)
        missing = sorted(set(range(1, final + 1)) - printed)
        if missing:
            when = out.attempts[-1].last_at if out.attempts else 0.0
            add(when, f"job {job}: {len(missing)} of steps 1..{final} never printed: "
                + _ranges(missing))  # fmt: skip
    return found


def _ranges(numbers: Sequence[int]) -> str:
    """[1, 2, 3, 7] -> ``1-3,7``."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


# -- 4 ------------------------------------------------------------------------------------
def auto_resume_outcomes(
    jobs: Sequence[JobSample],
    auto_resume_jobs: Collection[int],
    events: Sequence[Event],
    reason_kinds: Collection[str] = REASON_KINDS,
    excused: Collection[int] = (),
) -> list[Violation]:
    """Every auto-resume job the driver submitted ends COMPLETED, or an event of a kind in
    ``reason_kinds`` names it (``excused``: jobs the driver cancelled itself). The job ids
    come from the driver, not from the product's job_submit.lua."""
    found: list[Violation] = []
    add = _adder(found, "auto_resume_outcome")
    final = _final(jobs)
    for job in sorted(set(auto_resume_jobs) - set(excused)):
        last = final.get(job)
        if last is not None and last.state == "COMPLETED":
            continue
        if any(e.job_id == job and e.kind in reason_kinds for e in events):
            continue
        if last is None:
            add(0.0, f"auto-resume job {job} never seen in Slurm")
            continue
        add(last.t, f"auto-resume job {job} {'ended' if last.ended else 'is still'} "
            f"{last.state} (exit {last.exit_code}, {last.restarts} restarts, seen {ts(last.t)}); "
            f"no event of {sorted(reason_kinds)} names it")  # fmt: skip
    return found


# -- 5 ------------------------------------------------------------------------------------
def left_behind(
    jobs: Sequence[JobSample],
    reservations: Sequence[ReservationSweep],
    nodes: Sequence[NodeSample],
    spares: Collection[str],
    injections: Sequence[Injection] = (),
    admin: Sequence[AdminAction] = (),
    settle_s: float = 300.0,
    prefixes: Sequence[str] = PRODUCT_NAME_PREFIXES,
) -> list[Violation]:
    """At the end: no helper or deep-check job of the product pending or running, no
    reservation of the product, no node that no fault touched (a spare above all) out of
    service under a product reason other than the spare pool's, and none still out for a
    passing cause (drain, reset, reboot, check) ``settle_s`` after its last fault healed
    (hold and replace are for good)."""
    found: list[Violation] = []
    add = _adder(found, "left_behind")
    for j in _final(jobs).values():
        if j.name.startswith(tuple(prefixes)) and not j.ended:
            add(j.t, f"job {j.job_id} {j.name!r} still {j.state} on "
                f"{','.join(j.nodes) or '-'} at {ts(j.t)}")  # fmt: skip
    if reservations:
        last = max(reservations, key=lambda r: r.t)
        for r in last.reservations:
            if r.name.startswith(tuple(prefixes)):
                add(last.t, f"reservation {r.name!r} on {','.join(r.nodes)} "
                    f"(flags {r.flags}) still there at {ts(last.t)}")  # fmt: skip
    sweeps = _sweeps(nodes)
    if not sweeps:
        return found
    end, final = sweeps[-1]
    held = _held(admin, end)
    for s in sorted(final, key=lambda s: s.node):
        if s.node in held or not s.out or not s.ours or s.spare:
            continue
        heals = [i.heal_at for i in injections if i.target == s.node]
        if not heals:
            what = "spare out of the pool" if s.node in spares else "node left out"
            add(end, f"{what} at the end, no fault was injected on it: {s.show()}")
        elif s.reason.split(" ")[0] in PASSING and all(
            h is not None and h <= end - settle_s for h in heals
        ):
            add(end, f"{s.show()} at the end, {end - max(h or 0.0 for h in heals):.0f} s "
                "after its last fault healed")  # fmt: skip
    return found


# -- 6 ------------------------------------------------------------------------------------
def actions_logged(
    nodes: Sequence[NodeSample],
    jobs: Sequence[JobSample],
    ctld: Sequence[CtldAction],
    events: Sequence[Event],
    injections: Sequence[Injection] = (),
    admin: Sequence[AdminAction] = (),
    window_s: float = 10.0,
    processes: Sequence[ProcessSample] = (),
) -> list[Violation]:
    """Every product change Slurm shows has an event naming its node or job within
    ``window_s``, one event per change (two drains of a node need two events); with
    slurmctld's log, every event claiming a node change is in it.

    Changes, from the samples: a node taking a ``hyperpod:`` reason, or leaving one for
    service (not ``hyperpod:reboot``: Slurm resumes a rebooted node itself; not when the
    admin did it); a job's Restarts growing (not when slurmctld requeued it for a failed
    node, nor when the driver hit the job). From slurmctld's log: a reason set to
    ``hyperpod:``, a reboot neither the driver nor the admin asked for. A node taking our
    reason while no controller answered as leader (``processes``: the latest sample of
    each) is an agent's self-drain, which no controller can log. The event of an
    intent found applied after a crash may be further than ``window_s`` from its change:
    widen it for such drills."""
    found: list[Violation] = []
    add = _adder(found, "unlogged_action")
    w = window_s
    ordered = sorted(events, key=lambda e: e.at)
    by_time = sorted(processes, key=lambda p: p.t)
    used: set[tuple[str, int, str]] = set()  # (record, event id, node or job)

    def logged(record: str, lo: float, hi: float, node: str = "", job: int = -1) -> bool:
        """Take the earliest event not yet used for this record and target."""
        for e in ordered:
            key = (record, e.id, node or str(job))
            if key not in used and _near(e.at, lo, hi, w):
                if (node and e.names_node(node)) or (job >= 0 and e.names_job(job)):
                    used.add(key)
                    return True
        return False

    def leaderless(t: float) -> bool:
        latest = {p.controller_id: p for p in by_time if p.t <= t}
        return bool(latest) and not any(p.alive and p.leader_claimed for p in latest.values())

    def driver_did(target: str, lo: float, hi: float) -> bool:
        return any(i.target == target and _near(i.t, lo, hi, w) for i in injections) or any(
            a.node == target and _near(a.start, lo, hi, w) for a in admin
        )

    for node, series in _series(nodes).items():
        for prev, cur in zip(series, series[1:], strict=False):
            took = cur.ours and (not prev.ours or cur.reason != prev.reason)
            took = took and not leaderless(cur.t)
            back = prev.ours and not cur.out and not prev.reason.startswith("hyperpod:reboot")
            back = back and not driver_did(node, prev.t, cur.t)
            if (took or back) and not logged("samples", prev.t, cur.t, node=node):
                change = f"took {cur.reason!r}" if took else f"left {prev.reason!r} for service"
                add(cur.t, f"{node} {change} between {ts(prev.t)} and {ts(cur.t)}: "
                    f"no event names it within {w} s")  # fmt: skip
    for c in sorted(ctld, key=lambda c: c.t):
        ours = c.verb == "reason" and c.detail.startswith("hyperpod:") and not leaderless(c.t)
        reboot = c.verb == "reboot" and not driver_did(c.target, c.t, c.t)
        if (ours or reboot) and not logged("ctld", c.t, c.t, node=c.target):
            add(c.t, f"slurmctld at {ts(c.t)}: {c.verb} of {c.target} {c.detail!r}: "
                f"no event names {c.target} within {w} s")  # fmt: skip
    by_job: dict[int, list[JobSample]] = defaultdict(list)
    for j in sorted(jobs, key=lambda j: j.t):
        by_job[j.job_id].append(j)
    for job, js in sorted(by_job.items()):
        for was, now in zip(js, js[1:], strict=False):
            if now.restarts <= was.restarts or driver_did(str(job), was.t, now.t):
                continue
            slurm = any(
                c.verb == "slurm_requeue" and c.target == str(job) and _near(c.t, was.t, now.t, w)
                for c in ctld
            )
            if not slurm and not logged("jobs", was.t, now.t, job=job):
                add(now.t, f"job {job} Restarts {was.restarts} -> {now.restarts} between "
                    f"{ts(was.t)} and {ts(now.t)}: no event names it within {w} s, and "
                    "slurmctld did not requeue it for a failed node")  # fmt: skip
    claims = [e for e in events if e.kind in NODE_CLAIMS and e.node] if ctld else []
    for e in claims:
        if not any(
            c.target == e.node
            and c.verb in ("reason", "state", "reboot")
            and _near(c.t, e.at, e.at, w)
            for c in ctld
        ):
            text = f"event {e.id} {e.kind} of {e.node} at {ts(e.at)}: slurmctld logged no change"
            found.append(
                Violation("unconfirmed_event", e.at, f"{text} within {w} s: {e.message!r}")
            )
    return found


# -- 7 ------------------------------------------------------------------------------------
def one_leader(processes: Sequence[ProcessSample], events: Sequence[Event]) -> list[Violation]:
    """At most one controller acts at any instant.

    Events do not carry the controller that wrote them, and slurmctld logs no requester at
    the info level, so this rests on two records. (a) The process samples: a controller
    that claimed to lead at two consecutive samples of its own, with no takeover event of
    its own between them, led throughout; another one claiming to lead in between is a
    second leader. (b) The takeover events (``<id> leads (lease token N)``): an action
    event written after the controller of the latest takeover was seen dead (and before
    any newer takeover) was written by a controller that never recorded taking the lease.
    A deposed leader writing while a live one holds the lease is beyond these records."""
    found: list[Violation] = []
    add = _adder(found, "one_leader")
    series: dict[str, list[ProcessSample]] = defaultdict(list)
    for p in sorted(processes, key=lambda p: p.t):
        series[p.controller_id].append(p)
    takeovers = sorted(
        (e.at, e.message.split(" leads", 1)[0].strip(), e.id)
        for e in events
        if e.kind == "leader" and " leads" in e.message
    )
    claims = [p for p in processes if p.alive and p.leader_claimed]
    for cid, ps in series.items():
        seen: set[str] = set()  # one violation per other controller: the first is the clue
        for a, b in zip(ps, ps[1:], strict=False):
            firm = all(p.alive and p.leader_claimed for p in (a, b)) and not any(
                who == cid and a.t < at <= b.t for at, who, _ in takeovers
            )
            for o in claims if firm else []:
                if o.controller_id != cid and a.t < o.t < b.t and o.controller_id not in seen:
                    seen.add(o.controller_id)
                    add(o.t, f"{cid} (pid {a.pid}) claimed to lead at {ts(a.t)} and {ts(b.t)}, "
                        f"{o.controller_id} (pid {o.pid}) too at {ts(o.t)}")  # fmt: skip
    for e in events:
        before = [x for x in takeovers if x[0] <= e.at]
        if e.kind not in NODE_CLAIMS | {"requeue"} or not before:
            continue
        took_at, who, took_id = before[-1]
        since = [p for p in series.get(who, []) if took_at < p.t < e.at]
        if since and not since[-1].alive:
            add(e.at, f"event {e.id} {e.kind} of {e.node or f'job {e.job_id}'} at {ts(e.at)}, "
                f"under {who}'s takeover (event {took_id} at {ts(took_at)}), but {who} "
                f"(pid {since[-1].pid}) dead at {ts(since[-1].t)}, no takeover since")  # fmt: skip
    return found


# -- 8 ------------------------------------------------------------------------------------
def reconcile_liveness(
    status: Sequence[StatusSample], interval_s: float, factor: float = 3.0
) -> list[Violation]:
    """While a controller leads, its last pass is never more than ``factor`` x
    ``interval_s`` old; a new leader has that long from the first sample naming it. One
    violation per stall, with its longest gap."""
    found: list[Violation] = []
    add = _adder(found, "reconcile_stall")
    limit = factor * interval_s
    stall: list[tuple[float, StatusSample]] = []

    def close() -> None:
        if stall:
            gap, worst = max(stall, key=lambda s: s[0])
            last = "never" if worst.last_pass_at is None else ts(worst.last_pass_at)
            add(stall[0][1].t, f"leader {worst.leader}: no pass for {gap:.1f} s at "
                f"{ts(worst.t)} (limit {limit:g} s, last pass {last}); stalled from "
                f"{ts(stall[0][1].t)} over {len(stall)} samples")  # fmt: skip
            stall.clear()

    leader, since = None, 0.0
    for s in sorted(status, key=lambda s: s.t):
        if s.leader != leader:
            close()
            leader, since = s.leader, s.t
        last = since if s.last_pass_at is None else max(since, s.last_pass_at)
        if s.leader is not None and s.t - last > limit:
            stall.append((s.t - last, s))
        else:
            close()
    close()
    return found


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
            ev.jobs, ev.auto_resume_jobs, ev.events, limits.reason_kinds, limits.excused_jobs
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
    lines += ["", f"violations: {len(violations)}"]
    lines += [f"  [{v.invariant}] {ts(v.when)}: {v.evidence}" for v in violations]
    lines += ["", f"replay: {command} --seed {seed} --minutes {minutes:g} --rate {rate:g}"]
    return "\n".join(lines)
