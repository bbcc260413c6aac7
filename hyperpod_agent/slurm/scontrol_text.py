"""Pure parsers for ``scontrol show node -o`` and ``scontrol show job -o``.

One record per line of ``Key=value`` pairs whose values may contain spaces and ``=``. Used for
single-object look-ups (fast, with a precise "not found") and as a fallback to the JSON output.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from hyperpod_agent.errors import SlurmParseError
from hyperpod_agent.slurm._common import (
    FINISHED_STATES,
    NULLS,
    hostnames,
    iso,
    number,
    parse_auto_resume,
    split_state,
)
from hyperpod_agent.slurm.models import Job, Node

SCONTROL_NODE_ARGV = ["scontrol", "show", "node", "-o"]
SCONTROL_JOB_ARGV = ["scontrol", "show", "job", "-o"]

# ``Reason=text [user@2026-11-22T06:39:46]``: Slurm appends who set the reason and when.
_REASON_TAIL = re.compile(r"^(?P<text>.*?)\s*\[(?P<user>[^\]@\s]*)@(?P<time>[^\]\s]+)\]\s*$")
# Slurm's keys start upper case and may contain ':' and '/' (``AllocNode:Sid``, ``CPUs/Task``).
_KEY_AT = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/]*)=")
# Values that are free text: only a key seen in the captures ends them, not any ``word=``.
_FREE_TEXT = frozenset(
    "Reason Comment AdminComment SystemComment JobName OS Command WorkDir StdOut StdErr StdIn "
    "Features AvailableFeatures ActiveFeatures".split()
)
_NODE_KEYS = frozenset(
    "NodeName Arch CoresPerSocket CPUAlloc CPUEfctv CPUTot CPULoad AvailableFeatures "
    "ActiveFeatures Gres GresDrain GresUsed NodeAddr NodeHostName Port Version OS RealMemory "
    "AllocMem FreeMem Sockets Boards State ThreadsPerCore TmpDisk Weight Owner MCS_label "
    "Partitions BootTime SlurmdStartTime LastBusyTime CfgTRES AllocTRES CapWatts CurrentWatts "
    "AveWatts ExtSensorsJoules ExtSensorsWatts ExtSensorsTemp Reason NextState Comment Extra "
    "ResumeAfterTime InstanceId InstanceType".split()
)
_JOB_KEYS = frozenset(
    "JobId ArrayJobId ArrayTaskId JobName UserId GroupId MCS_label Priority Nice Account QOS "
    "JobState Reason Dependency Requeue Restarts BatchFlag Reboot ExitCode DerivedExitCode "
    "RunTime TimeLimit TimeMin SubmitTime EligibleTime AccrueTime StartTime EndTime Deadline "
    "SuspendTime SecsPreSuspend LastSchedEval Scheduler Partition AllocNode:Sid ReqNodeList "
    "ExcNodeList NodeList BatchHost NumNodes NumCPUs NumTasks CPUs/Task ReqB:S:C:T TRES "
    "Socks/Node NtasksPerN:B:S:C CoreSpec MinCPUsNode MinMemoryNode MinMemoryCPU "
    "MinTmpDiskNode Features DelayBoot OverSubscribe Contiguous Licenses Network Command "
    "WorkDir AdminComment SystemComment Comment StdErr StdIn StdOut Power Prefer "
    "TresPerNode TresPerJob MailUser MailType".split()
)
# scontrol key -> Job.extra key, the same names the JSON parser uses.
_SCONTROL_JOB_EXTRA = (
    ("Comment", "comment"),
    ("ReqNodeList", "required_nodes"),
    ("ArrayJobId", "array_job_id"),
    ("ArrayTaskId", "array_task_id"),
    ("Account", "account"),
)


def parse_kv_line(line: str, known: frozenset[str] | None = None) -> dict[str, str]:
    """One ``scontrol show ... -o`` record -> {key: value}.

    Values may contain spaces (``OS=Linux 6.1 #1 SMP``, ``JobName=my job``) and ``=``
    (``Reason=a=b``). A new key starts at whitespace followed by ``Key=`` with an upper-case
    ``Key``; inside a free-text value (Reason, Comment, ...) only a key from ``known`` (by
    default every node and job key of Slurm 22.05) that the record has not shown yet does.
    """
    if known is None:
        known = _NODE_KEYS | _JOB_KEYS
    starts: list[tuple[int, int, str]] = []
    current: str | None = None
    seen: set[str] = set()
    for m in _KEY_AT.finditer(line):
        key = m.group(1)
        # A record never repeats a key, so a repeated one is part of a value (Reason=State=x).
        if key in seen or (current in _FREE_TEXT and key not in known):
            continue
        starts.append((m.start(1), m.end(), key))
        seen.add(key)
        current = key
    if not starts:
        raise SlurmParseError(["scontrol"], f"no key=value pairs in {line[:80]!r}")
    out: dict[str, str] = {}
    for i, (_, value_at, key) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(line)
        out[key] = line[value_at:end].strip()
    return out


def _records(text: str, first_key: str, argv: list[str]) -> list[str]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) == 1 and lines[0].strip().startswith("No ") and "=" not in lines[0]:
        return []  # "No nodes in the system", "No jobs in the system"
    for ln in lines:
        if not ln.lstrip().startswith(first_key + "="):
            raise SlurmParseError(argv, f"expected a line starting {first_key}=, got {ln[:60]!r}")
    return lines


def _reason(value: str) -> tuple[str, str, datetime | None]:
    m = _REASON_TAIL.match(value)
    if m is None:
        return value.strip(), "", None
    return m.group("text"), m.group("user"), iso(m.group("time"))


def parse_scontrol_nodes(text: str, argv: Sequence[str] = SCONTROL_NODE_ARGV) -> list[Node]:
    """``scontrol show node -o`` -> nodes (one line per node)."""
    argv = list(argv)
    nodes: list[Node] = []
    for line in _records(text, "NodeName", argv):
        kv = parse_kv_line(line, _NODE_KEYS)
        base, flags = split_state(kv.get("State", ""))
        reason, user, when = _reason(kv.get("Reason", ""))
        partitions = kv.get("Partitions", "")
        nodes.append(
            Node(
                name=kv["NodeName"],
                state=base,
                flags=flags,
                reason=reason,
                reason_user=user,
                reason_time=when,
                partitions=tuple(p for p in partitions.split(",") if p and p not in NULLS),
                address=kv.get("NodeAddr", ""),
                port=number(kv.get("Port")) or None,
                boot_time=iso(kv.get("BootTime", "")),
                slurmd_start_time=iso(kv.get("SlurmdStartTime", "")),
            )
        )
    return nodes


def _user(value: str) -> str:
    """``root(0)`` -> ``root``."""
    return value.split("(", 1)[0].strip()


def _uid(value: str) -> int | None:
    """``root(0)`` -> 0; None without the number."""
    _, _, rest = value.partition("(")
    return number(rest.rstrip(")")) if rest.endswith(")") else None


def _scontrol_exit(value: str) -> tuple[int | None, int]:
    code, _, sig = value.partition(":")
    return number(code), number(sig) or 0


def parse_scontrol_jobs(text: str, argv: Sequence[str] = SCONTROL_JOB_ARGV) -> list[Job]:
    """``scontrol show job -o`` -> jobs (one line per job)."""
    argv = list(argv)
    jobs: list[Job] = []
    for line in _records(text, "JobId", argv):
        kv = parse_kv_line(line, _JOB_KEYS)
        job_id = number(kv.get("JobId"))
        state = kv.get("JobState", "").upper()
        if job_id is None or not state:
            raise SlurmParseError(argv, f"record without JobId/JobState: {line[:60]!r}")
        finished = state in FINISHED_STATES
        exit_code, signal = _scontrol_exit(kv.get("ExitCode", ""))
        reason = kv.get("Reason", "")
        admin_comment = "" if kv.get("AdminComment", "") in NULLS else kv["AdminComment"]
        extra = {
            name: kv[key]
            for key, name in _SCONTROL_JOB_EXTRA
            if kv.get(key, "") not in NULLS and kv[key] != "0"
        }
        if signal:
            extra["exit_signal"] = str(signal)
        jobs.append(
            Job(
                job_id=job_id,
                name=kv.get("JobName", ""),
                state=state,
                state_reason="" if reason in NULLS else reason,
                nodes=hostnames(kv.get("NodeList", ""), argv),
                restart_count=number(kv.get("Restarts")) or 0,
                auto_resume=parse_auto_resume(admin_comment),
                admin_comment=admin_comment,
                exit_code=exit_code if finished else None,
                requeue=kv.get("Requeue", "0") == "1",
                batch_host="" if kv.get("BatchHost", "") in NULLS else kv["BatchHost"],
                user=_user(kv.get("UserId", "")),
                uid=_uid(kv.get("UserId", "")),
                partition=kv.get("Partition", ""),
                start_time=iso(kv.get("StartTime", "")) if state != "PENDING" else None,
                end_time=iso(kv.get("EndTime", "")) if finished else None,
                extra=extra,
            )
        )
    return jobs
