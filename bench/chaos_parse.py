"""Pure parsers of a chaos campaign's raw text into its evidence records
(bench/chaos_evidence.py): Slurm's ``scontrol show node|job|res -o`` and slurmctld's log,
the product's event log and status, the training jobs' output files. Slurm's text is
parsed here, not with the product's parsers: those are what is being checked."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo

from bench.chaos_evidence import (
    Attempt,
    CtldAction,
    CtldLine,
    Event,
    EvidenceError,
    JobSample,
    NodeSample,
    Reservation,
    ReservationSweep,
    StatusSample,
    TrainOutput,
)
from hyperpod_agent.errors import SlurmParseError
from hyperpod_agent.slurm.hostlist import expand_hostlist

# -- scontrol -o records ---------------------------------------------------------------
_KEY_AT = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/]*)=")
# Values that are free text: inside them, only a key Slurm prints (below) starts a new one.
_FREE_TEXT = frozenset(
    "Reason Comment AdminComment SystemComment JobName OS Command WorkDir StdOut StdErr "
    "StdIn Features AvailableFeatures ActiveFeatures Extra".split()
)
# Keys of Slurm 22.05's node, job and reservation records (tests/fixtures/slurm).
_KNOWN = frozenset(
    "NodeName Arch CoresPerSocket CPUAlloc CPUEfctv CPUTot CPULoad AvailableFeatures "
    "ActiveFeatures Gres GresDrain GresUsed NodeAddr NodeHostName Port Version OS RealMemory "
    "AllocMem FreeMem Sockets Boards State ThreadsPerCore TmpDisk Weight Owner MCS_label "
    "Partitions BootTime SlurmdStartTime LastBusyTime CfgTRES AllocTRES CapWatts "
    "CurrentWatts AveWatts ExtSensorsJoules ExtSensorsWatts ExtSensorsTemp Reason NextState "
    "Comment Extra ResumeAfterTime InstanceId InstanceType JobId ArrayJobId ArrayTaskId "
    "JobName UserId GroupId Priority Nice Account QOS JobState Dependency Requeue Restarts "
    "BatchFlag Reboot ExitCode DerivedExitCode RunTime TimeLimit TimeMin SubmitTime "
    "EligibleTime AccrueTime StartTime EndTime Deadline SuspendTime SecsPreSuspend "
    "LastSchedEval Scheduler Partition AllocNode:Sid ReqNodeList ExcNodeList NodeList "
    "BatchHost NumNodes NumCPUs NumTasks CPUs/Task ReqB:S:C:T TRES Socks/Node "
    "NtasksPerN:B:S:C CoreSpec MinCPUsNode MinMemoryNode MinMemoryCPU MinTmpDiskNode "
    "Features DelayBoot OverSubscribe Contiguous Licenses Network Command WorkDir "
    "AdminComment SystemComment StdErr StdIn StdOut Power Prefer TresPerNode TresPerJob "
    "MailUser MailType ReservationName Duration Nodes NodeCnt CoreCnt PartitionName Flags "
    "Users Groups Accounts BurstBuffer Watts MaxStartDelay".split()
)
_REASON_TAIL = re.compile(r"^(?P<text>.*?)\s*\[(?P<user>[^\]@\s]*)@[^\]\s]+\]\s*$")


def parse_kv(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` record -> {key: value}; values may hold spaces and
    ``=`` (``Reason=a b=c``, ``JobName=my job``)."""
    starts: list[tuple[int, int, str]] = []
    current = ""
    for m in _KEY_AT.finditer(line):
        key = m.group(1)
        # a record never repeats a key: a repeated one is inside a value (Reason=State=x)
        if any(key == k for *_, k in starts) or (current in _FREE_TEXT and key not in _KNOWN):
            continue
        starts.append((m.start(1), m.end(), key))
        current = key
    if not starts:
        raise EvidenceError(f"no key=value pairs in {line[:80]!r}")
    return {
        key: line[at : starts[i + 1][0] if i + 1 < len(starts) else len(line)].strip()
        for i, (_, at, key) in enumerate(starts)
    }


def _records(text: str, first_key: str) -> list[dict[str, str]]:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) == 1 and lines[0].startswith("No ") and "=" not in lines[0]:
        return []  # "No nodes in the system", "No reservations in the system"
    out = []
    for ln in lines:
        if not ln.startswith(first_key + "="):
            raise EvidenceError(f"expected a line starting {first_key}=, got {ln[:60]!r}")
        out.append(parse_kv(ln))
    return out


def _hosts(expr: str) -> tuple[str, ...]:
    try:
        return tuple(expand_hostlist(expr))
    except SlurmParseError as exc:
        raise EvidenceError(f"bad node list {expr!r}: {exc}") from exc


def parse_nodes(t: float, text: str) -> list[NodeSample]:
    """``scontrol show node -o`` taken at ``t`` -> one sample per node."""
    out = []
    for kv in _records(text, "NodeName"):
        base, *flags = kv.get("State", "").split("+")
        reason, user = kv.get("Reason", ""), ""
        if m := _REASON_TAIL.match(reason):
            reason, user = m.group("text"), m.group("user")
        out.append(
            NodeSample(t, kv["NodeName"], base.rstrip("*~#%$@^!-"), frozenset(flags), reason, user)
        )
    return out


def parse_jobs(t: float, text: str) -> list[JobSample]:
    """``scontrol show job -o`` taken at ``t`` -> one sample per job.

    Chosen over sacct because it carries ``Restarts`` (sacct has no such field): the driver
    samples it every sweep, with MinJobAge long enough that ended jobs stay listed."""
    out = []
    for kv in _records(text, "JobId"):
        try:
            job_id, restarts = int(kv["JobId"]), int(kv.get("Restarts", "0"))
        except ValueError as exc:
            raise EvidenceError(f"job record {kv.get('JobId')!r}: {exc}") from exc
        state = kv.get("JobState", "").split()[0] if kv.get("JobState") else ""
        nodes = _hosts(kv.get("NodeList", ""))
        out.append(
            JobSample(
                t, job_id, kv.get("JobName", ""), state, restarts, nodes, kv.get("ExitCode", "")
            )
        )
    return out


def parse_reservations(t: float, text: str) -> ReservationSweep:
    """``scontrol show res -o`` taken at ``t``."""
    found = tuple(
        Reservation(
            kv["ReservationName"],
            _hosts(kv.get("Nodes", "")),
            kv.get("Flags", ""),
            kv.get("Users", ""),
        )
        for kv in _records(text, "ReservationName")
    )
    return ReservationSweep(t, found)


# -- slurmctld's log --------------------------------------------------------------------
_CTLD_LINE = re.compile(r"^\[(?P<at>\d{4}-\d\d-\d\dT[0-9:.+\-]+)\]\s?(?P<text>.*)$")
_CTLD_ACTIONS = (
    # node_mgr.c update_node(): every scontrol update of a node's reason or state
    (re.compile(r"update_node: node (?P<t>\S+) reason set to: (?P<d>.*)$"), "reason"),
    (re.compile(r"update_node: node (?P<t>\S+) state set to (?P<d>\S+)"), "state"),
    # proc_req.c _slurm_rpc_reboot_nodes(): scontrol reboot, a hostlist
    (re.compile(r"reboot request queued for nodes (?P<t>\S+)"), "reboot"),
    # job_mgr.c: Slurm's own requeue of a batch job whose node failed
    (
        re.compile(r"requeue (?:job )?JobId=(?P<t>\d+)\S* due to (?:node failure|failure of)"),
        "slurm_requeue",
    ),
    (re.compile(r"(?:Requeuing|requeue) JobId=(?P<t>\d+)"), "requeue"),
)


def parse_ctld_log(text: str, tz: tzinfo | None = None) -> list[CtldLine]:
    """slurmctld's log -> (t, text) per line that starts with ``[timestamp]``.

    slurmctld prints local time without a zone: ``tz`` is the cluster's (None: this
    host's). Continuation lines (no timestamp) are dropped."""
    out = []
    for line in text.splitlines():
        if not (m := _CTLD_LINE.match(line)):
            continue
        try:
            at = datetime.fromisoformat(m.group("at"))
        except ValueError:
            continue
        if at.tzinfo is None and tz is not None:
            at = at.replace(tzinfo=tz)
        out.append(CtldLine(at.timestamp(), m.group("text")))
    return out


def ctld_actions(lines: list[CtldLine]) -> list[CtldAction]:
    """The node and job changes slurmctld logged, one per node for a hostlist.

    At the info level Slurm 22.05 does not log who asked (uid, host): the request is known
    by its verb only, and the product's changes by their reason (``hyperpod:``)."""
    out: list[CtldAction] = []
    for line in lines:
        for pattern, verb in _CTLD_ACTIONS:
            if m := pattern.search(line.text):
                targets = _hosts(m.group("t")) if verb == "reboot" else (m.group("t"),)
                detail = m.groupdict().get("d") or ""
                out.extend(CtldAction(line.t, verb, target, detail) for target in targets)
                break
    return out


# -- the product's records (checked, never trusted) ---------------------------------------
def _epoch(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    at = datetime.fromisoformat(str(value))
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def parse_events(text: str) -> list[Event]:
    """``hyperpod events --json`` -> events, oldest first (by id)."""
    try:
        rows = json.loads(text)
        events = [
            Event(
                int(r["id"]),
                _epoch(r["at"]) or 0.0,
                str(r["kind"]),
                r.get("node"),
                None if r.get("job_id") is None else int(r["job_id"]),
                str(r.get("cause") or ""),
                str(r.get("message") or ""),
            )
            for r in rows
        ]
    except (ValueError, TypeError, KeyError) as exc:
        raise EvidenceError(f"event log: {exc}") from exc
    return sorted(events, key=lambda e: e.id)


def status_sample(t: float, doc: Mapping[str, object]) -> StatusSample | None:
    """One answer of ``hyperpod status --json`` (``leader``, ``last_pass_at``) at ``t``.
    None when a standby answered: its ``last_pass_at`` is its own (never, while it
    waits), which says nothing of the leader's passes."""
    leader = doc.get("leader")
    answered = doc.get("this_controller")
    if answered is not None and leader is not None and str(answered) != str(leader):
        return None
    try:
        return StatusSample(
            t, None if leader is None else str(leader), _epoch(doc.get("last_pass_at"))
        )
    except ValueError as exc:
        raise EvidenceError(f"status at {t}: {exc}") from exc


# -- training job output (examples/train.sbatch, train_in_place.sbatch, train_toy.py) ------
# The same lines as hyperpod_agent/localcluster/drill.py parses; not imported from there,
# as that module pulls in the controller.
_ATTEMPT = re.compile(r"^attempt (\d+) on (\S+) at ([\d.]+)")
_RESUME = re.compile(r"^resume step=(\d+).* at=([\d.]+)")
_FRESH = re.compile(r"^fresh start at=([\d.]+)")
_STEP = re.compile(r"^step=(\d+) .*at=([\d.]+)")
_DONE = re.compile(r"^done step=(\d+) at=([\d.]+)")


@dataclass
class _Building:
    number: int
    nodes: str
    started_at: float
    start_step: int | None = None
    steps: list[tuple[int, float]] = field(default_factory=list)
    last_at: float = 0.0


def parse_train_output(text: str) -> TrainOutput:
    """A training job's output file (appended across attempts) -> its attempts, in file
    order; lines before the first ``attempt`` line are ignored."""
    runs: list[_Building] = []
    done: int | None = None
    for line in text.splitlines():
        if m := _ATTEMPT.match(line):
            runs.append(_Building(int(m.group(1)), m.group(2), float(m.group(3))))
            runs[-1].last_at = runs[-1].started_at
            continue
        if not runs:
            continue
        run, at = runs[-1], None
        if m := _RESUME.match(line):
            run.start_step, at = int(m.group(1)), float(m.group(2))
        elif m := _FRESH.match(line):
            run.start_step, at = 0, float(m.group(1))
        elif m := _STEP.match(line):
            run.steps.append((int(m.group(1)), float(m.group(2))))
            at = run.steps[-1][1]
        elif m := _DONE.match(line):
            done, at = int(m.group(1)), float(m.group(2))
        if at is not None:
            run.last_at = max(run.last_at, at)
    attempts = tuple(
        Attempt(r.number, r.nodes, r.started_at, r.start_step, tuple(r.steps), r.last_at)
        for r in runs
    )
    return TrainOutput(attempts, done)
