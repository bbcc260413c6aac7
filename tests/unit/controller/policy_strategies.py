"""Whole clusters as one reconcile pass sees them, for the policy's property tests.

A :class:`Case` (policy_case.py) is a :class:`Snapshot` and a config, with every part
of the snapshot drawn: nodes of every owner (in service, silent, Slurm's, a human's, ours under each
verb, admin requests, spares, rebooting), several open faults per node and their closed
history (repeats, several faults in one report, bursts), completed remedies, open
intents of each kind, auto-resume jobs with tracked budgets, step retries and watches,
training progress that hangs or straggles, declared findings, deep checks under way
and their outcomes. ``Case.roles`` records whose each node was made to be, so an
invariant can say "a human's node" without asking the code under test.

Speed: a hypothesis draw costs ~50 us, and a pass of ``decide`` ~0.3 ms; the properties
run 10,000 examples or more each in CI. Drawn field by field a case took ~50 draws
(7 ms an example). So each part of the case (the nodes, the open faults, the jobs...) is one drawn
byte string read by :class:`_Bytes`, one byte a choice from a table whose first entry is
the simplest: the shrinker, lowering bytes toward zero, shortens lists (their count
comes first) and simplifies entries. Entries have fixed widths, so a shorter list
leaves the others where they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from ctl_helpers import NOW, action_row, ts
from hypothesis import strategies as st
from policy_case import CONFIG_DIMS, SLURM_USER, SPARE_REASON, Case, config_at, progress

from hyperpod_agent.controller.config import ControllerConfig
from hyperpod_agent.controller.snapshot import NodeHealth, Snapshot
from hyperpod_agent.controller.store.checks import NodeOutcome
from hyperpod_agent.controller.store.rows import ActionRow, FaultRow, FindingRow, TrackedJob
from hyperpod_agent.health import Action, Verdict
from hyperpod_agent.slurm.models import Job, Node

T = TypeVar("T")
MAX_NODES = 10


@dataclass(frozen=True)
class Role:
    """One way a node can look to Slurm; ``who`` is the invariants' label."""

    who: str  # up | silent | slurm | human | ours | held | admin | spare | rebooting
    state: str
    flags: tuple[str, ...] = ()
    reason: str = ""
    user: str = ""
    reason_age: float | None = None


_D = ("DRAIN",)
ROLES = [
    Role("up", "IDLE"),
    Role("up", "ALLOCATED"),
    Role("up", "MIXED"),
    Role("up", "ALLOCATED"),
    Role("silent", "ALLOCATED", ("NOT_RESPONDING",)),
    Role("slurm", "DOWN", ("NOT_RESPONDING",), "Not responding", SLURM_USER, 300),
    Role("slurm", "DOWN", (), "Node unexpectedly rebooted", "", 300),
    Role("human", "IDLE", _D, "maintenance", "alice", 300),
    Role("human", "ALLOCATED", _D, "Not responding to IPMI - RMA 1234, keep out", "root", 300),
    Role("human", "IDLE", _D, "NHC: check_fs_mount: /scratch not mounted", "root", 300),
    Role("human", "DOWN", ("NOT_RESPONDING",), "Not responding", "alice", 300),
    Role("human", "IDLE", _D, "hyperpod-ops keep out", "bob", 300),
    Role("human", "IDLE", _D, "Action:Replace after the RMA, ask bob", "bob", 300),
    Role("ours", "IDLE", _D, "hyperpod:drain agent heartbeat_lost x", SLURM_USER, 300),
    Role("ours", "IDLE", _D, "hyperpod:drain disk fs_full x", "root", 300),
    Role("ours", "IDLE", _D, "hyperpod:reset gpu0 xid46 x", "root", 700),
    Role("ours", "ALLOCATED", _D, "hyperpod:reset gpu0 xid46 x", "root", 100),
    Role("ours", "IDLE", _D, "hyperpod:reboot gpu0 xid79 x", "root", 300),
    Role("held", "IDLE", _D, "hyperpod:replace gpu0 xid54 x", "root", 300),
    Role("held", "IDLE", _D, "hyperpod:hold gpu0 lemon x", "root", 300),
    Role("admin", "IDLE", ("DRAIN", "FAIL"), "Action:Replace", "alice", 300),
    Role("admin", "IDLE", _D, " action : reboot ", "alice", 300),
    Role("spare", "IDLE", _D, SPARE_REASON, "root", 3000),
    Role("spare", "IDLE", _D, SPARE_REASON, "root", 3000),
    Role("spare", "IDLE", ("DRAIN", "NOT_RESPONDING"), SPARE_REASON, "root", 3000),
    Role("spare", "IDLE", ("DRAIN", "REBOOT_REQUESTED"), SPARE_REASON, "root", 3000),
    Role("rebooting", "MIXED", ("REBOOT_REQUESTED",)),
    Role("rebooting", "DOWN", ("DRAIN", "REBOOT_ISSUED"), "hyperpod:reboot gpu0 xid79 x", "root"),
    # waiting for the check before first use, after a replacement, after an admin resume
    Role("ours", "IDLE", _D, "hyperpod:check provision new deep check before first use", "root"),
    Role("ours", "IDLE", _D, "hyperpod:check replace back replaced for gpu0 xid54", "root", 300),
    Role("ours", "ALLOCATED", _D, "hyperpod:check admin resume after repair", "alice", 300),
]
PARTITIONS = [("a",), ("b",), ("a", "b")]
# (verdict, report age, last word age, booted how long ago): None is "never"/"unknown"
HEALTH: list[tuple[Verdict | None, float | None, float | None, float | None]] = [
    (Verdict.HEALTHY, 5, 5, None),
    (Verdict.FAULTY, 5, 5, None),
    (Verdict.HEALTHY, 5, 5, 500),
    (Verdict.FAULTY, 5, 5, 500),
    (Verdict.DEGRADED, 5, 5, None),
    (Verdict.HEALTHY, 600, 5, 500),  # the report is older than the last boot
    (Verdict.FAULTY, 600, 5, 500),
    (Verdict.HEALTHY, 200, 200, None),  # agent silent past heartbeat_timeout_s
    (Verdict.FAULTY, 200, 200, None),
    (None, None, None, None),  # no agent
    (None, None, 5, None),  # heartbeats, no report yet
]
# (component, code, action, urgent): what an agent may confirm
FAULTS = [
    ("gpu0", "xid79", Action.REBOOT, True),
    ("gpu0", "xid48", Action.REBOOT, False),
    ("gpu0", "xid46", Action.RESET, False),
    ("gpu0", "xid74", Action.RESET, True),
    ("gpu0", "xid54", Action.REPLACE, False),
    ("gpu1", "xid79", Action.REBOOT, True),
    ("nic0", "link_down", Action.REBOOT, True),
    ("disk", "fs_full", Action.DRAIN, False),
    ("disk", "fs_inodes_low", Action.DRAIN, False),
    ("gpu0", "xid13", Action.MONITOR, False),
    ("gpu1", "xid31", Action.MONITOR, True),
]
MILD_FAULTS = [f for f in FAULTS if f[2] in (Action.DRAIN, Action.MONITOR)]
OPEN_AGES = [60.0, 10.0, 300.0, 1200.0, 5000.0]  # 10 s: inside the shared-cause window
CLOSED_AGES = [900.0, 100.0, 1800.0, 5000.0, 200_000.0]  # past escalation, inside lemon
DONE = ["reboot", "replace", "drain", "hold", "resume"]
DONE_AGES = [100.0, 10.0, 400.0, 2000.0, 3500.0]
INTENTS = ["drain", "reboot", "resume", "replace", "replace+spare", "hold", "requeue", "cancel"]
JOB_STATES = ["RUNNING", "RUNNING", "FAILED", "NODE_FAIL", "PENDING", "COMPLETED"]
AUTO = [3, 1, None, "agent"]  # --auto-resume=N, the plain switch, none, an agent saw it
MODES = ["none", "ok", "hung_stuck", "hung_behind", "hung_declared", "straggler"]
# tracked budget: None or (attempts, state, last requeue age, acted on this restart)
TRACKED: list[tuple[int, str, float | None, bool] | None] = [
    None,
    (0, "tracked", None, False),
    (1, "requeued", 5.0, False),
    (1, "requeued", 900.0, True),
    (3, "exhausted", 900.0, False),
    (3, "requeued", 900.0, False),
]
WATCH = [None, 10.0, 120.0]  # not told to end yet / told 10 s ago / 120 s ago
OUTCOMES = [("OK", 10.0, True), ("FAIL", 10.0, True), ("UNKNOWN", 10.0, False), ("OK", 1e5, True)]


class _Bytes:
    """Choices read in order from one drawn byte string: each byte is one choice (its
    value modulo the number of options); past the end every choice is the first."""

    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def index(self, n: int) -> int:
        byte = self._data[self._at] if self._at < len(self._data) else 0
        self._at += 1
        return byte % n

    def pick(self, options: Sequence[T]) -> T:
        return options[self.index(len(options))]

    def node(self, names: Sequence[str]) -> str:
        return names[self.index(MAX_NODES) % len(names)]

    def entries(self, most: int, width: int, least: int = 0) -> list[_Bytes]:
        """A list of ``least`` to ``most`` entries of ``width`` choices each, one reader
        an entry. The count comes first (the shrinker shortens a list before it
        simplifies what is in it) and every entry has its own slot, read or not: a
        shorter list leaves what follows where it was."""
        count = least + self.index(most - least + 1)
        start, self._at = self._at, self._at + most * width
        return [
            _Bytes(self._data[start + k * width : start + (k + 1) * width]) for k in range(count)
        ]


def _bytes(size: int) -> st.SearchStrategy[_Bytes]:
    return st.binary(min_size=size, max_size=size).map(_Bytes)


# one string a part of the case: for each list, its count and then (most x width) bytes
_NODES = _bytes(1 + MAX_NODES * 3)
_OPEN = _bytes(1 + 8 * 4)
_CLOSED = _bytes(1 + 6 * 3)
_ACTIONS = _bytes(1 + 4 * 3 + 1 + 3 * 3)  # completed, then open intents
_JOBS = _bytes(1 + 4 * 10)
_EXTRAS = _bytes(1 + 2 * 3 + 1 + 2 * 3 + 1 + 2 * 1 + 1 + 3 * 2 + 1 + 2 * 1 + 1)
_CONFIG = _bytes(len(CONFIG_DIMS))


def _config(b: _Bytes) -> ControllerConfig:
    index = 0
    for _, values in CONFIG_DIMS:
        index = index * len(values) + b.index(len(values))
    return config_at(index)


@st.composite
def cases(draw: st.DrawFn, faults: Sequence[tuple[str, str, Action, bool]] = FAULTS) -> Case:
    """A cluster with everything a pass may see; ``faults``: what agents may report."""
    b = draw(_NODES)
    names, nodes, health, roles = [], {}, {}, {}
    for k, e in enumerate(b.entries(MAX_NODES, 3, least=3)):
        role, parts, (verdict, gen, seen, boot) = e.pick(ROLES), e.pick(PARTITIONS), e.pick(HEALTH)
        name = f"n{k + 1:02d}"
        names.append(name)
        roles[name] = role.who
        nodes[name] = Node(
            name=name, state=role.state, flags=frozenset(role.flags), reason=role.reason,
            reason_user=role.user, partitions=parts,
            reason_time=None if role.reason_age is None else ts(NOW - role.reason_age),
            boot_time=None if boot is None else ts(NOW - boot),
        )  # fmt: skip
        if seen is not None:
            health[name] = NodeHealth(verdict, None if gen is None else NOW - gen, NOW - seen)
    spares = [n for n in names if roles[n] == "spare"]

    b = draw(_OPEN)
    open_faults: list[FaultRow] = []
    for e in b.entries(8, 4):
        name, (comp, code, action, urgent), age = e.node(names), e.pick(faults), e.pick(OPEN_AGES)
        if any((f.node, f.component, f.code) == (name, comp, code) for f in open_faults):
            continue  # the store keeps one open fault per node, component and code
        first = NOW - age
        if e.index(2):  # in the same report as the node's last fault: the same time
            first = next((f.first_seen for f in reversed(open_faults) if f.node == name), first)
        open_faults.append(
            FaultRow(len(open_faults) + 1, name, comp, code, "FAIL", action.value, urgent,
                     first, max(first, NOW - 5), 1, "m", None, "p")
        )  # fmt: skip
    b = draw(_CLOSED)
    closed: list[FaultRow] = []
    for e in b.entries(6, 3):
        name, (comp, code, action, urgent), age = e.node(names), e.pick(faults), e.pick(CLOSED_AGES)
        first = NOW - age
        closed.append(
            FaultRow(500 + len(closed), name, comp, code, "FAIL", action.value, urgent,
                     first, first + 20, 2, "m", first + 30, "p")
        )  # fmt: skip
    # what the store's burst_peers returns: closed faults of an open one's code and time
    peers = [
        c for c in closed
        if any(c.code == f.code and abs(c.first_seen - f.first_seen) <= 30 for f in open_faults)
    ]  # fmt: skip

    b = draw(_JOBS)
    jobs: list[Job] = []
    tracked: dict[int, TrackedJob] = {}
    findings: list[FindingRow] = []
    for k, e in enumerate(b.entries(4, 10)):
        job_id, state, auto, mode = 100 + k, e.pick(JOB_STATES), e.pick(AUTO), e.pick(MODES)
        budget, named, restarts = e.pick(TRACKED), e.index(2), e.index(2)
        size, picks = 1 + e.index(3), [e.node(names) for _ in range(3)]
        job_nodes = tuple(dict.fromkeys(picks[:size]))
        jobs.append(
            Job(job_id=job_id, name=f"j{job_id}", state=state, nodes=job_nodes,
                restart_count=restarts, auto_resume=auto if isinstance(auto, int) else None,
                exit_code=None if state == "RUNNING" else 1,
                extra={"required_nodes": ",".join(job_nodes)} if named else {})
        )  # fmt: skip
        for n, name in enumerate(job_nodes):
            prog = progress(mode, job_id, n == 0)
            opted = {job_id: 3} if auto == "agent" else {}
            if (prog is not None or opted) and name in health:
                h = health[name]
                health[name] = NodeHealth(
                    h.verdict, h.generated_at, h.last_seen, {**h.jobs_opted_in, **opted},
                    (*h.progress, *([prog] if prog else [])),
                )  # fmt: skip
        if mode == "hung_declared":
            findings.append(FindingRow(k + 1, "hang", job_id, restarts, "", 100, "", NOW - 60))
        if budget is not None:
            attempts, tstate, last, acted = budget
            tracked[job_id] = TrackedJob(
                job_id, 3, attempts, "x", tstate, None if last is None else NOW - last,
                restarts if acted else None, None, NOW - 900,
            )  # fmt: skip

    b = draw(_ACTIONS)
    done = [
        action_row(e.pick(DONE), e.node(names), "done", updated_at=NOW - e.pick(DONE_AGES))
        for e in b.entries(4, 3)
    ]
    in_flight: list[ActionRow] = []
    for e in b.entries(3, 3):
        kind, name, state = e.pick(INTENTS), e.node(names), e.pick(["intent", "applied"])
        if kind in ("requeue", "cancel"):
            if jobs:
                job_id = jobs[names.index(name) % len(jobs)].job_id
                in_flight.append(action_row(kind, None, state, NOW - 5, job_id=job_id))
            continue
        params: dict[str, object] = {}
        if kind == "replace+spare" and spares:
            params["spare"] = spares[names.index(name) % len(spares)]
        in_flight.append(action_row(kind.split("+")[0], name, state, NOW - 5, params=params))

    b = draw(_EXTRAS)
    for e in b.entries(2, 3):
        job_at, name, age = e.index(4), e.node(names), e.pick(DONE_AGES)
        if jobs:
            job = jobs[job_at % len(jobs)]
            node = job.nodes[names.index(name) % len(job.nodes)]
            row = FindingRow(
                50 + len(findings), "straggler", job.job_id, 0, node, -1, "", NOW - age
            )
            findings.append(row)
    running = [j for j in jobs if j.state == "RUNNING"]
    step_retries: dict[int, tuple[str, str]] = {}
    watched: dict[int, float | None] = {}
    for e in b.entries(2, 3):
        job_at, surgery, told = e.index(4), e.index(2), e.pick(WATCH)
        if not running:
            continue
        job = running[job_at % len(running)]
        if surgery and spares:
            step_retries[job.job_id] = (job.nodes[-1], spares[job_at % len(spares)])
        else:
            watched[job.job_id] = None if told is None else NOW - told
    checking = frozenset(e.node(names) for e in b.entries(2, 1))
    outcomes = {}
    for e in b.entries(3, 2):
        name, (result, age, ran) = e.node(names), e.pick(OUTCOMES)
        check = "" if result == "OK" else "nccl"
        outcomes[name] = NodeOutcome(1, name, "reentry", result, check, "x", ran, NOW - age)
    replaced = frozenset(e.node(names) for e in b.entries(2, 1))
    snap = Snapshot(
        nodes=nodes, jobs=jobs, health=health, open_faults=open_faults,
        history=[*open_faults, *closed], burst_peers=peers, findings=findings,
        in_flight=in_flight, done=done, tracked=tracked,
        requeues_last_minute=b.pick([0, 19, 20]), started_at=NOW - 3600, replaced=replaced,
        check_outcomes=outcomes, checking=checking, step_retries=step_retries,
        watched_jobs=watched,
    )  # fmt: skip
    return Case(snap, _config(draw(_CONFIG)), roles)
