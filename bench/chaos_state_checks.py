"""Invariants 1 to 5 of a chaos campaign, on what Slurm and the jobs show: the admin's
nodes left alone, the blast radius, the jobs' steps, the auto-resume jobs' ends and what
is left behind; and the helpers the other invariants share (bench/chaos_check.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime

from bench.chaos_evidence import (
    AdminAction,
    Event,
    Injection,
    JobSample,
    NodeSample,
    ReservationSweep,
    TrainOutput,
    Violation,
)

# The product's helper jobs and reservations (slurm/resize.py: hyperpod-expand-<job>;
# controller/deepcheck/job.py: hyperpod-check-<run>-<created>).
PRODUCT_NAME_PREFIXES = ("hyperpod-expand-", "hyperpod-check-")
# Event kinds that say why an auto-resume job was left alone (controller/records.py,
# stepretry/run.py, intent_log.py) and the executor's bookkeeping kinds.
REASON_KINDS = frozenset(
    "budget_spent not_requeued step_retry_failed action_failed abandoned exhausted "
    "not_retried requeue_failed".split()
)
# Reasons for a passing cause: resumed by the product once the node is healthy.
PASSING = frozenset({"hyperpod:drain", "hyperpod:reset", "hyperpod:reboot", "hyperpod:check"})
Add = Callable[[float, str], None]


def ts(t: float) -> str:
    """``t`` as UTC ISO time with milliseconds (how the evidence names instants)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def adder(found: list[Violation], invariant: str) -> Add:
    return lambda when, text: found.append(Violation(invariant, when, text))


def node_series(samples: Iterable[NodeSample]) -> dict[str, list[NodeSample]]:
    out: dict[str, list[NodeSample]] = defaultdict(list)
    for s in sorted(samples, key=lambda s: s.t):
        out[s.node].append(s)
    return out


def node_sweeps(samples: Iterable[NodeSample]) -> list[tuple[float, list[NodeSample]]]:
    out: dict[float, list[NodeSample]] = defaultdict(list)
    for s in samples:
        out[s.t].append(s)
    return sorted(out.items())


def final_jobs(jobs: Iterable[JobSample]) -> dict[int, JobSample]:
    return {j.job_id: j for j in sorted(jobs, key=lambda j: j.t)}


def admin_held(admin: Iterable[AdminAction], t: float) -> set[str]:
    """The nodes out of service by the admin's own hand at ``t``."""
    return {a.node for a in admin if a.kind in ("drain", "reserve") and a.holds_at(t)}


def near(t: float, lo: float, hi: float, slack: float) -> bool:
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
    add = adder(found, "admin_untouched")
    series = node_series(nodes)
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
    add = adder(found, "blast_radius")
    run: list[tuple[float, list[NodeSample]]] = []

    def close() -> None:
        if run:
            peak_t, peak = max(run, key=lambda r: len(r[1]))
            add(run[0][0], f"{len(peak)} nodes out under product reasons at {ts(peak_t)} "
                f"(limit {max_out}); over it from {ts(run[0][0])} to {ts(run[-1][0])} "
                f"({len(run)} sweeps): " + "; ".join(s.show() for s in peak))  # fmt: skip
            run.clear()

    for t, sweep in node_sweeps(nodes):
        held = admin_held(admin, t)
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
    add = adder(found, "training")
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
    nodes: Sequence[NodeSample] = (),
) -> list[Violation]:
    """Every auto-resume job the driver submitted ends COMPLETED, or an event of a kind in
    ``reason_kinds`` names it (``excused``: jobs the driver cancelled itself), or the
    product's last word on it is that it waits for capacity (``requeue_waiting``) and
    Slurm's last sweep agrees: fewer nodes in service than the job needs. The job ids
    come from the driver, not from the product's job_submit.lua."""
    found: list[Violation] = []
    add = adder(found, "auto_resume_outcome")
    final = final_jobs(jobs)
    sweeps = node_sweeps(nodes)
    in_service = sum(not n.out for n in sweeps[-1][1]) if sweeps else None
    for job in sorted(set(auto_resume_jobs) - set(excused)):
        last = final.get(job)
        if last is not None and last.state == "COMPLETED":
            continue
        if any(e.job_id == job and e.kind in reason_kinds for e in events):
            continue
        said = [e for e in events if e.job_id == job]
        waiting = bool(said) and max(said, key=lambda e: e.id).kind == "requeue_waiting"
        if waiting and last is not None and in_service is not None:
            if in_service < max(1, len(last.nodes)):
                continue  # no capacity, as the product said
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
    add = adder(found, "left_behind")
    for j in final_jobs(jobs).values():
        if j.name.startswith(tuple(prefixes)) and not j.ended:
            add(j.t, f"job {j.job_id} {j.name!r} still {j.state} on "
                f"{','.join(j.nodes) or '-'} at {ts(j.t)}")  # fmt: skip
    if reservations:
        last = max(reservations, key=lambda r: r.t)
        for r in last.reservations:
            if r.name.startswith(tuple(prefixes)):
                add(last.t, f"reservation {r.name!r} on {','.join(r.nodes)} "
                    f"(flags {r.flags}) still there at {ts(last.t)}")  # fmt: skip
    sweeps = node_sweeps(nodes)
    if not sweeps:
        return found
    end, final = sweeps[-1]
    held = admin_held(admin, end)
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
