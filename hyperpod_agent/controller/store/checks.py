"""Deep-check runs and their per-node outcomes (docs/deep-checks.md).

A run's ``phase`` is its intent log: every Slurm step of a run (reservation, resume,
submission, restoring the nodes) is repeatable, and the phase is written after each,
so a controller killed at any point finishes the run from where it stood.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hyperpod_agent.controller.store.dialect import Tx
from hyperpod_agent.controller.store.findings import FindingLog
from hyperpod_agent.controller.store.lease import Lease
from hyperpod_agent.controller.store.rows import EventIn
from hyperpod_agent.errors import HyperpodError

# The order a run goes through; ``done`` is the only closed phase.
PHASES = ("draining", "reserve", "resume", "submit", "running", "restore", "done")
OPEN_PHASES = PHASES[:-1]


@dataclass(frozen=True)
class CheckRun:
    COLUMNS: ClassVar[str] = (
        "id, nodes, level, purpose, phase, job_id, prior, requested_by, drain_first, "
        "created_at, updated_at, deadline, error"
    )
    id: int
    nodes: tuple[str, ...]
    level: str
    purpose: str  # spare | reentry | admin
    phase: str
    job_id: int | None
    # each node's Slurm reason when the run was planned: what it goes back to
    prior: Mapping[str, str]
    requested_by: str
    drain_first: bool
    created_at: float
    updated_at: float
    deadline: float | None  # set when the job is submitted
    error: str = ""

    @property
    def reservation(self) -> str:
        """The run's name in Slurm: its reservation, its job, its results directory.
        The creation time keeps it unique when a state database starts afresh."""
        return f"hyperpod-check-{self.id}-{int(self.created_at)}"

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> CheckRun:
        return cls(
            int(r[0]),
            tuple(json.loads(r[1])),
            r[2],
            r[3],
            r[4],
            None if r[5] is None else int(r[5]),
            dict(json.loads(r[6])),
            r[7],
            bool(r[8]),
            float(r[9]),
            float(r[10]),
            None if r[11] is None else float(r[11]),
            r[12] or "",
        )


@dataclass(frozen=True)
class NodeOutcome:
    """One node's outcome in one run: the gating verdict, the check that decided it."""

    COLUMNS: ClassVar[str] = "run_id, node, purpose, outcome, check_name, cause, ran, detail, at"
    run_id: int
    node: str
    purpose: str
    outcome: str  # OK | FAIL | UNKNOWN
    check: str  # the first gating check that was not OK ('' when all were)
    cause: str
    ran: bool  # False: the run never reached the node (nothing known of its hardware)
    at: float
    detail: list[dict[str, Any]] = field(default_factory=list)  # every CheckResult

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> NodeOutcome:
        return cls(
            int(r[0]), r[1], r[2], r[3], r[4], r[5], bool(r[6]), float(r[8]), json.loads(r[7])
        )


class PhaseMoved(HyperpodError):
    """A phase write found the run or surgery no longer in the phase its writer read
    (another controller moved it on): nothing was written; the writer stops there."""


def move_phase(
    db: Tx, table: str, row_id: int, sets: list[str], args: list[Any], expect: str | None
) -> None:
    """``UPDATE table SET ... WHERE id=?``, with ``expect`` only while the row is still in
    that phase (compare-and-set): PhaseMoved otherwise, and the transaction rolls back."""
    where = "id=?"
    params: tuple[Any, ...] = (row_id,)
    if expect is not None:
        where, params = "id=? AND phase=?", (row_id, expect)
    row = db.execute(
        f"UPDATE {table} SET {', '.join(sets)} WHERE {where} RETURNING phase", (*args, *params)
    ).fetchone()
    if row is None and expect is not None:
        now = db.execute(f"SELECT phase FROM {table} WHERE id=?", (row_id,)).fetchone()
        found = now[0] if now is not None else "gone"
        raise PhaseMoved(f"{table} {row_id} is {found!r} now, not {expect!r}: left to its writer")


class CheckLog(FindingLog):
    def add_check_run(
        self,
        nodes: Sequence[str],
        level: str,
        purpose: str,
        prior: Mapping[str, str],
        requested_by: str,
        drain_first: bool,
        now: float,
        event: EventIn,
    ) -> int:
        """Record a planned run (and its event) durably; its id."""
        phase = "draining" if drain_first else "reserve"
        with self._tx(durable=True) as db:
            cur = db.execute(
                "INSERT INTO deep_checks (nodes, level, purpose, phase, job_id, prior, "
                "requested_by, drain_first, created_at, updated_at, deadline) "
                "VALUES (?,?,?,?,NULL,?,?,?,?,?,NULL) RETURNING id",
                (
                    json.dumps(list(nodes)),
                    level,
                    purpose,
                    phase,
                    json.dumps(dict(prior)),
                    requested_by,
                    int(drain_first),
                    now,
                    now,
                ),
            )
            run_id = int(cur.fetchone()[0])
            self._put_event(db, event, now)
        return run_id

    def check_run(self, run_id: int) -> CheckRun | None:
        rows = self._query(f"SELECT {CheckRun.COLUMNS} FROM deep_checks WHERE id=?", (run_id,))
        return CheckRun.from_row(rows[0]) if rows else None

    def open_check_runs(self) -> list[CheckRun]:
        marks = ",".join("?" * len(OPEN_PHASES))
        rows = self._query(
            f"SELECT {CheckRun.COLUMNS} FROM deep_checks WHERE phase IN ({marks}) ORDER BY id",
            OPEN_PHASES,
        )
        return [CheckRun.from_row(r) for r in rows]

    def recent_check_runs(self, limit: int = 50) -> list[CheckRun]:
        rows = self._query(
            f"SELECT {CheckRun.COLUMNS} FROM deep_checks ORDER BY id DESC LIMIT ?", (limit,)
        )
        return [CheckRun.from_row(r) for r in rows]

    def set_check_phase(
        self,
        run_id: int,
        phase: str,
        now: float,
        *,
        job_id: int | None = None,
        deadline: float | None = None,
        error: str | None = None,
        nodes: Sequence[str] | None = None,
        outcomes: Sequence[NodeOutcome] = (),
        events: Sequence[EventIn] = (),
        touch_outcomes: bool = False,
        expect: str | None = None,
        fence: Lease | None = None,
    ) -> None:
        """Move a run to ``phase`` with what it learnt, its outcomes and events, in one
        durable transaction. ``touch_outcomes`` dates the run's outcomes ``now``: once
        its nodes are back in place, so a spare re-drained into the pool by the run
        itself counts as checked since it entered the pool. ``expect``: only while the
        run is still in that phase (PhaseMoved otherwise); ``fence``: only while that
        lease holds (LeaseLost)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        sets = ["phase=?", "updated_at=?"]
        args: list[Any] = [phase, now]
        for column, value in (("job_id", job_id), ("deadline", deadline), ("error", error)):
            if value is not None:
                sets.append(f"{column}=?")
                args.append(value)
        if nodes is not None:
            sets.append("nodes=?")
            args.append(json.dumps(list(nodes)))
        with self._tx(durable=True) as db:
            if fence is not None:
                self._check_fence(db, fence, now)
            move_phase(db, "deep_checks", run_id, sets, args, expect)
            for o in outcomes:
                db.execute(
                    f"INSERT INTO deep_check_results ({NodeOutcome.COLUMNS}) "
                    "VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(run_id, node) DO UPDATE SET "
                    "purpose=excluded.purpose, outcome=excluded.outcome, "
                    "check_name=excluded.check_name, cause=excluded.cause, ran=excluded.ran, "
                    "detail=excluded.detail, at=excluded.at",
                    (
                        o.run_id,
                        o.node,
                        o.purpose,
                        o.outcome,
                        o.check,
                        o.cause,
                        int(o.ran),
                        json.dumps(o.detail),
                        o.at,
                    ),
                )
            if touch_outcomes:
                db.execute("UPDATE deep_check_results SET at=? WHERE run_id=?", (now, run_id))
            for ev in events:
                self._put_event(db, ev, now)

    def run_outcomes(self, run_id: int) -> list[NodeOutcome]:
        rows = self._query(
            f"SELECT {NodeOutcome.COLUMNS} FROM deep_check_results WHERE run_id=? ORDER BY node",
            (run_id,),
        )
        return [NodeOutcome.from_row(r) for r in rows]

    def latest_outcomes(self) -> dict[str, NodeOutcome]:
        """Each node's newest outcome (what the gates read)."""
        rows = self._query(
            f"SELECT {NodeOutcome.COLUMNS} FROM deep_check_results r WHERE at = "
            "(SELECT MAX(at) FROM deep_check_results WHERE node=r.node) ORDER BY run_id"
        )
        return {o.node: o for o in (NodeOutcome.from_row(r) for r in rows)}

    def node_outcomes(self, node: str, limit: int = 20) -> list[NodeOutcome]:
        rows = self._query(
            f"SELECT {NodeOutcome.COLUMNS} FROM deep_check_results WHERE node=? "
            "ORDER BY at DESC, run_id DESC LIMIT ?",
            (node, limit),
        )
        return [NodeOutcome.from_row(r) for r in rows]
