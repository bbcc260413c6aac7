"""Invariants 6 to 8 of a chaos campaign: the product's own records (its event log, its
controllers, its status) checked against Slurm's and the driver's (bench/chaos_check.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from bench.chaos_evidence import (
    AdminAction,
    CtldAction,
    Event,
    Injection,
    JobSample,
    NodeSample,
    ProcessSample,
    StatusSample,
    Violation,
)
from bench.chaos_state_checks import adder, near, node_series, ts

# Event kinds that claim a change of a node in Slurm (the executor's node actions).
NODE_CLAIMS = frozenset({"drain", "hold", "replace", "reboot", "resume"})


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
    add = adder(found, "unlogged_action")
    w = window_s
    ordered = sorted(events, key=lambda e: e.at)
    by_time = sorted(processes, key=lambda p: p.t)
    used: set[tuple[str, int, str]] = set()  # (record, event id, node or job)

    def logged(record: str, lo: float, hi: float, node: str = "", job: int = -1) -> bool:
        """Take the earliest event not yet used for this record and target."""
        for e in ordered:
            key = (record, e.id, node or str(job))
            if key not in used and near(e.at, lo, hi, w):
                if (node and e.names_node(node)) or (job >= 0 and e.names_job(job)):
                    used.add(key)
                    return True
        return False

    def leaderless(t: float) -> bool:
        latest = {p.controller_id: p for p in by_time if p.t <= t}
        return bool(latest) and not any(p.alive and p.leader_claimed for p in latest.values())

    def driver_did(target: str, lo: float, hi: float) -> bool:
        return any(i.target == target and near(i.t, lo, hi, w) for i in injections) or any(
            a.node == target and near(a.start, lo, hi, w) for a in admin
        )

    for node, series in node_series(nodes).items():
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
                c.verb == "slurm_requeue" and c.target == str(job) and near(c.t, was.t, now.t, w)
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
            and near(c.t, e.at, e.at, w)
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
    add = adder(found, "one_leader")
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
    add = adder(found, "reconcile_stall")
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
