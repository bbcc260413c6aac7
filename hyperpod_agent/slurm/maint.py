"""Maintenance reservations and batch submission: the Slurm calls deep checks need.

A maintenance reservation (``Flags=MAINT``) keeps user jobs off the nodes under test
and shows the maintenance in Slurm's own views (``scontrol show reservation``,
``sinfo`` state ``maint``). It is created without ``IGNORE_JOBS``, so Slurm itself
refuses it on a node that still runs a job ("Requested nodes are busy"). A job runs
on a node only while the node is not drained, so the caller resumes the nodes after
the reservation exists and drains them again before deleting it.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hyperpod_agent.errors import SlurmError, SlurmParseError
from hyperpod_agent.slurm._common import usage_error
from hyperpod_agent.slurm.hostlist import compress_hostlist, expand_hostlist
from hyperpod_agent.slurm.scontrol_text import parse_kv_line

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")
_RESV_KEYS = frozenset(
    {"ReservationName", "StartTime", "EndTime", "Duration", "Nodes", "NodeCnt", "CoreCnt",
     "Features", "PartitionName", "Flags", "TRES", "Users", "Groups", "Accounts",
     "Licenses", "State", "BurstBuffer", "Watts", "MaxStartDelay"}
)  # fmt: skip
# what scontrol says when the reservation does not exist (show / delete)
_MISSING = ("not found", "Requested reservation is invalid")


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: tuple[str, ...]
    flags: frozenset[str]
    users: tuple[str, ...]
    state: str  # ACTIVE, INACTIVE


def check_name(name: str, what: str = "reservation name") -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise usage_error(["scontrol"], f"invalid {what} {name!r}: letters, digits, '._-' only")
    return name


def parse_reservations(text: str, argv: Sequence[str]) -> list[Reservation]:
    """``scontrol show reservation -o`` -> reservations ("No reservations in the system"
    is none)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or (line.startswith("No ") and "=" not in line):
            continue
        if not line.startswith("ReservationName="):
            raise SlurmParseError(list(argv), f"expected ReservationName=, got {line[:60]!r}")
        kv = parse_kv_line(line, _RESV_KEYS)
        nodes = kv.get("Nodes", "")
        users = kv.get("Users", "")
        out.append(
            Reservation(
                name=kv["ReservationName"],
                nodes=tuple(expand_hostlist(nodes)) if nodes and nodes != "(null)" else (),
                flags=frozenset(f for f in kv.get("Flags", "").split(",") if f),
                users=tuple(u for u in users.split(",") if u and u != "(null)"),
                state=kv.get("State", ""),
            )
        )
    return out


class SlurmCalls:
    """What the call groups mixed into SlurmClient use of it (defined there)."""

    def _run(self, argv: Sequence[str], timeout: float | None = None) -> str:
        raise NotImplementedError

    def _change(self, argv: list[str], what: str, target: str, reason: str = "") -> None:
        raise NotImplementedError

    def _exec(self, argv: list[str], timeout: float | None) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError


class MaintenanceCalls(SlurmCalls):
    """Reservations and batch submission, mixed into SlurmClient."""

    def reservations(self) -> list[Reservation]:
        """Every reservation slurmctld knows."""
        argv = ["scontrol", "show", "reservation", "-o"]
        return parse_reservations(self._run(argv), argv)

    def create_maint_reservation(
        self, name: str, nodes: Sequence[str], minutes: int, users: Sequence[str]
    ) -> None:
        """A MAINT reservation of ``nodes`` from now for ``minutes``, usable by ``users``.
        Slurm refuses it (SlurmError "Requested nodes are busy") while a job runs there."""
        check_name(name)
        names = [check_name(n, "node name") for n in nodes]
        who = [check_name(u, "user name") for u in users]
        if not names or not who or minutes < 1:
            raise usage_error(
                ["scontrol", "create"], "a reservation needs nodes, users and minutes"
            )
        argv = [
            "scontrol", "create", "reservation", f"ReservationName={name}",
            f"Nodes={compress_hostlist(names)}", "StartTime=now", f"Duration={int(minutes)}",
            f"Users={','.join(who)}", "Flags=MAINT",
        ]  # fmt: skip
        self._change(argv, "create-reservation", name, compress_hostlist(names))

    def delete_reservation(self, name: str) -> bool:
        """Delete ``name``; False when it was already gone. SlurmError while a job still
        runs in it ("Requested reservation is in use")."""
        argv = ["scontrol", "delete", f"ReservationName={check_name(name)}"]
        try:
            self._change(argv, "delete-reservation", name)
        except SlurmError as exc:
            if any(m in exc.stderr for m in _MISSING):
                return False
            raise
        return True

    def submit_batch(
        self,
        script: Path,
        *,
        job_name: str,
        nodes: Sequence[str],
        reservation: str,
        minutes: int,
        output: Path,
        partition: str | None = None,
    ) -> int:
        """``sbatch`` a script on exactly ``nodes`` (one task each) inside ``reservation``;
        the job id. Never requeued: a check that lost a node must end, not start over."""
        names = [check_name(n, "node name") for n in nodes]
        argv = [
            "sbatch", "--parsable", f"--job-name={check_name(job_name, 'job name')}",
            f"--reservation={check_name(reservation)}", f"--nodelist={compress_hostlist(names)}",
            f"--nodes={len(names)}", "--ntasks-per-node=1", f"--time={max(int(minutes), 1)}",
            "--no-requeue", "--exclusive", f"--output={output}",
        ]  # fmt: skip
        if partition:
            argv.append(f"--partition={check_name(partition, 'partition name')}")
        argv.append(str(script))
        out = self._run(argv).strip()
        head = out.split(";", 1)[0]
        if not head.isdigit():
            raise SlurmParseError(argv, f"sbatch --parsable printed {out[:60]!r}, not a job id")
        log.info("slurm submitted job %s (%s) on %s", head, job_name, compress_hostlist(names))
        return int(head)
