"""Step retries inside the allocation (docs/auto-resume.md): one row per surgery.

A surgery's ``phase`` is its intent log, as a deep-check run's is: it names the Slurm
step to do next and is written after each one, so a controller killed at any point
finishes the surgery, or rolls it back, from where it stood. The row is unique per
(job, step, failed attempt): a repeated request finds the surgery it started before.

A step under watch is one row per (job, step) that its helper renews. What the row says
of the step (its nodes, when its job started) was read from Slurm when the watch began,
never taken from the helper: the step's retry may blame only those nodes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from hyperpod_agent.controller.store.checks import CheckLog, move_phase
from hyperpod_agent.controller.store.lease import Lease
from hyperpod_agent.controller.store.rows import EventIn

# The order a surgery goes through; ``rollback`` undoes what is safe to undo after a
# failure. ``done`` (RETRYSTEP) and ``failed`` (REQUEUE) are closed.
PHASES = ("drain", "shrink", "expand", "absorb", "rollback", "done", "failed")
OPEN_PHASES = PHASES[:5]


@dataclass(frozen=True)
class StepRetry:
    COLUMNS: ClassVar[str] = (
        "id, job_id, step_id, attempt, budget, phase, bad_node, spare, reason, keep, "
        "helper_id, new_nodes, outcome, cause, rollback_from, requested_by, created_at, "
        "updated_at, owner_uid"
    )
    id: int
    job_id: int
    step_id: str
    attempt: int  # the attempt that failed; the retry is attempt + 1
    budget: int  # the job's auto-resume budget (a rolled-back surgery requeues within it)
    phase: str
    bad_node: str
    spare: str
    reason: str  # the bad node's drain reason
    keep: tuple[str, ...]  # the job's nodes but the bad one (a bad batch host stays)
    helper_id: int | None  # the helper allocation on the spare, once made
    new_nodes: tuple[str, ...]  # the job's nodes once the spare is in
    outcome: str  # '' while open, RETRYSTEP (done) or REQUEUE (failed)
    cause: str  # why the retry was decided; why it failed once it did
    rollback_from: str  # the phase that failed ('' unless rolled back)
    requested_by: str
    created_at: float
    updated_at: float
    owner_uid: int | None = None  # the job's owner, as Slurm said when it was decided

    @property
    def helper_name(self) -> str:
        """The helper allocation's job name: how a restarted controller finds it."""
        return f"hyperpod-expand-{self.job_id}"

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> StepRetry:
        return cls(
            int(r[0]),
            int(r[1]),
            r[2],
            int(r[3]),
            int(r[4]),
            r[5],
            r[6],
            r[7],
            r[8],
            tuple(json.loads(r[9])),
            None if r[10] is None else int(r[10]),
            tuple(json.loads(r[11])),
            r[12],
            r[13],
            r[14],
            r[15],
            float(r[16]),
            float(r[17]),
            None if r[18] is None else int(r[18]),
        )


@dataclass(frozen=True)
class StepWatch:
    """A running step's watch: renewed by its helper until ``expires_at``."""

    COLUMNS: ClassVar[str] = (
        "job_id, step_id, attempt, expires_at, end_at, nodes, began, created_at"
    )
    job_id: int
    step_id: str
    attempt: int
    expires_at: float
    end_at: float | None  # when the step was (first) told to end: its fault's first report
    nodes: tuple[str, ...]  # the job's nodes, read from Slurm when the watch began
    began: float  # the job's start, read from Slurm then (0: Slurm did not say)
    created_at: float

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> StepWatch:
        return cls(
            int(r[0]),
            r[1],
            int(r[2]),
            float(r[3]),
            None if r[4] is None else float(r[4]),
            tuple(json.loads(r[5])),
            float(r[6]),
            float(r[7]),
        )


class StepLog(CheckLog):
    def add_step_retry(
        self,
        job_id: int,
        step_id: str,
        attempt: int,
        budget: int,
        plan: Mapping[str, Any],
        requested_by: str,
        now: float,
        event: EventIn,
        *,
        owner_uid: int | None = None,
    ) -> tuple[int, bool]:
        """Record a surgery (and its event) durably: (its id, True), or (the id of the
        one recorded before for the same failed attempt, False)."""
        with self._tx(durable=True) as db:
            cur = db.execute(
                "INSERT INTO step_retries (job_id, step_id, attempt, budget, phase, bad_node, "
                "spare, reason, keep, cause, requested_by, created_at, updated_at, owner_uid) "
                "VALUES (?,?,?,?,'drain',?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING RETURNING id",
                (
                    job_id,
                    step_id,
                    attempt,
                    budget,
                    str(plan["bad_node"]),
                    str(plan["spare"]),
                    str(plan["reason"]),
                    json.dumps(list(plan["keep"])),
                    str(plan["cause"]),
                    requested_by,
                    now,
                    now,
                    owner_uid,
                ),
            )
            row = cur.fetchone()
            if row is not None:
                self._put_event(db, event, now)
                return int(row[0]), True
            old = db.execute(
                "SELECT id FROM step_retries WHERE job_id=? AND step_id=? AND attempt=?",
                (job_id, step_id, attempt),
            ).fetchone()
        return int(old[0]), False

    def step_retry(self, retry_id: int) -> StepRetry | None:
        rows = self._query(f"SELECT {StepRetry.COLUMNS} FROM step_retries WHERE id=?", (retry_id,))
        return StepRetry.from_row(rows[0]) if rows else None

    def find_step_retry(self, job_id: int, step_id: str, attempt: int) -> StepRetry | None:
        """The surgery started for this failed attempt of the step, if any."""
        rows = self._query(
            f"SELECT {StepRetry.COLUMNS} FROM step_retries WHERE job_id=? AND step_id=? "
            "AND attempt=?",
            (job_id, step_id, attempt),
        )
        return StepRetry.from_row(rows[0]) if rows else None

    def open_step_retries(self) -> list[StepRetry]:
        marks = ",".join("?" * len(OPEN_PHASES))
        rows = self._query(
            f"SELECT {StepRetry.COLUMNS} FROM step_retries WHERE phase IN ({marks}) ORDER BY id",
            OPEN_PHASES,
        )
        return [StepRetry.from_row(r) for r in rows]

    def step_retries_done(self, job_id: int, step_id: str | None = None) -> int:
        """In-place retries made for the job (what its budget has paid for), or for one
        step of it. The budget is the job's: the helper names its steps as it likes."""
        if step_id is None:
            rows = self._query(
                "SELECT count(*) FROM step_retries WHERE job_id=? AND outcome=?",
                (job_id, "RETRYSTEP"),
            )
        else:
            rows = self._query(
                "SELECT count(*) FROM step_retries WHERE job_id=? AND step_id=? AND outcome=?",
                (job_id, step_id, "RETRYSTEP"),
            )
        return int(rows[0][0])

    def job_step_retries(self, job_id: int, limit: int = 50) -> list[StepRetry]:
        """The job's surgeries, newest first."""
        rows = self._query(
            f"SELECT {StepRetry.COLUMNS} FROM step_retries WHERE job_id=? ORDER BY id DESC LIMIT ?",
            (job_id, limit),
        )
        return [StepRetry.from_row(r) for r in rows]

    def step_retry_jobs(self, limit: int = 200) -> list[int]:
        """Jobs that had a step retried in place, the most recent first."""
        rows = self._query(
            "SELECT job_id, max(id) AS last FROM step_retries GROUP BY job_id "
            "ORDER BY last DESC LIMIT ?",
            (limit,),
        )
        return [int(r[0]) for r in rows]

    def step_retries_since(self, since: float) -> int:
        """Surgeries started at or after ``since``, cluster-wide."""
        rows = self._query("SELECT count(*) FROM step_retries WHERE created_at>=?", (since,))
        return int(rows[0][0])

    def set_step_phase(
        self,
        retry_id: int,
        phase: str,
        now: float,
        *,
        helper_id: int | None = None,
        new_nodes: Sequence[str] | None = None,
        outcome: str | None = None,
        cause: str | None = None,
        rollback_from: str | None = None,
        events: Sequence[EventIn] = (),
        actions: Sequence[Mapping[str, Any]] = (),
        expect: str | None = None,
        fence: Lease | None = None,
    ) -> None:
        """Move a surgery to ``phase`` with what it learnt, its events and the actions it
        implies (``actions``: rows for the intent log, e.g. the requeue of a rolled-back
        job), in one durable transaction. ``expect``: only while the surgery is still in
        that phase (PhaseMoved otherwise); ``fence``: only while that lease holds."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        sets = ["phase=?", "updated_at=?"]
        args: list[Any] = [phase, now]
        fields = (
            ("helper_id", helper_id),
            ("outcome", outcome),
            ("cause", cause),
            ("rollback_from", rollback_from),
            ("new_nodes", None if new_nodes is None else json.dumps(list(new_nodes))),
        )
        for column, value in fields:
            if value is not None:
                sets.append(f"{column}=?")
                args.append(value)
        with self._tx(durable=True) as db:
            if fence is not None:
                self._check_fence(db, fence, now)
            move_phase(db, "step_retries", retry_id, sets, args, expect)
            for a in actions:
                db.execute(
                    "INSERT INTO actions (kind, node, job_id, reason, cause, params, state, "
                    "created_at, updated_at, next_attempt_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (
                        a["kind"],
                        a.get("node"),
                        a.get("job_id"),
                        a.get("reason", ""),
                        a["cause"],
                        json.dumps(a.get("params", {})),
                        a["state"],
                        now,
                        now,
                        now,
                    ),
                )
            for ev in events:
                self._put_event(db, ev, now)

    # -- steps under watch ------------------------------------------------------------
    def step_watch(self, job_id: int, step_id: str) -> StepWatch | None:
        rows = self._query(
            f"SELECT {StepWatch.COLUMNS} FROM step_watches WHERE job_id=? AND step_id=?",
            (job_id, step_id),
        )
        return StepWatch.from_row(rows[0]) if rows else None

    def start_watch(
        self,
        job_id: int,
        step_id: str,
        attempt: int,
        nodes: Sequence[str],
        began: float,
        now: float,
        ttl: float,
    ) -> None:
        """Watch a new launch of a step until ``now + ttl``, with what Slurm said of its
        job (``nodes``, ``began``); it replaces the step's earlier launch."""
        with self._tx(durable=False) as db:
            db.execute(
                "INSERT INTO step_watches (job_id, step_id, attempt, expires_at, end_at, nodes, "
                "began, created_at) VALUES (?,?,?,?,NULL,?,?,?) ON CONFLICT (job_id, step_id) "
                "DO UPDATE SET attempt=excluded.attempt, expires_at=excluded.expires_at, "
                "end_at=NULL, nodes=excluded.nodes, began=excluded.began, "
                "created_at=excluded.created_at",
                (job_id, step_id, attempt, now + ttl, json.dumps(list(nodes)), began, now),
            )

    def renew_watch(
        self, job_id: int, step_id: str, now: float, ttl: float, end_at: float | None
    ) -> tuple[float | None, bool]:
        """Renew a step's watch until ``now + ttl``; ``end_at`` (when the fault that ends
        it was first reported) is kept from the first time the end was asked. Returns
        (the kept ``end_at``, whether this renewal asked the end first)."""
        with self._tx(durable=False) as db:
            row = db.execute(
                "SELECT end_at FROM step_watches WHERE job_id=? AND step_id=?", (job_id, step_id)
            ).fetchone()
            if row is None:
                return None, False
            kept = row[0] if row[0] is not None else end_at
            db.execute(
                "UPDATE step_watches SET expires_at=?, end_at=? WHERE job_id=? AND step_id=?",
                (now + ttl, kept, job_id, step_id),
            )
        return (None if kept is None else float(kept)), row[0] is None and end_at is not None

    def live_watches(self, job_id: int, now: float) -> int:
        """How many of the job's steps are watched at ``now``."""
        rows = self._query(
            "SELECT count(*) FROM step_watches WHERE job_id=? AND expires_at>?", (job_id, now)
        )
        return int(rows[0][0])

    def watched_jobs(self, now: float) -> dict[int, float | None]:
        """Jobs with a step under watch at ``now``: job id -> when a step of it was first
        told to end (None while none was)."""
        rows = self._query(
            "SELECT job_id, min(end_at) FROM step_watches WHERE expires_at>? GROUP BY job_id",
            (now,),
        )
        return {int(r[0]): None if r[1] is None else float(r[1]) for r in rows}

    def end_watches_for_hang(self, job_id: int, now: float, event: EventIn) -> int:
        """Tell the job's watched steps to end because the job hung. Only live watches
        not told before; ``event`` (a ``step_end`` whose cause is the hang's record,
        ``hangs.ending.HangEnd``: the state's schema stays as the release before reads
        it) is written with them, once. Returns how many were told."""
        with self._tx(durable=True) as db:
            told = db.execute(
                "UPDATE step_watches SET end_at=? "
                "WHERE job_id=? AND expires_at>? AND end_at IS NULL",
                (now, job_id, now),
            ).rowcount
            if told:
                self._put_event(db, event, now)
        return int(told)

    def step_end_causes(self, job_id: int, since: float) -> list[str]:
        """The causes of the job's ``step_end`` events after ``since``, oldest first."""
        rows = self._query(
            "SELECT cause FROM events WHERE job_id=? AND kind='step_end' AND at>? "
            "ORDER BY id LIMIT 20",
            (job_id, since),
        )
        return [str(r[0]) for r in rows]

    def watch_launches(self, now: float) -> dict[int, float]:
        """Jobs with a step under watch at ``now``: job id -> when the oldest launch
        under watch began (progress recorded before it is an earlier launch's)."""
        rows = self._query(
            "SELECT job_id, min(created_at) FROM step_watches WHERE expires_at>? GROUP BY job_id",
            (now,),
        )
        return {int(r[0]): float(r[1]) for r in rows}

    def unwatch_job(self, job_id: int) -> None:
        """The job's steps are no longer under watch (its failure was answered)."""
        with self._tx(durable=False) as db:
            db.execute("DELETE FROM step_watches WHERE job_id=?", (job_id,))

    def prune_step_watches(self, now: float) -> None:
        with self._tx(durable=False) as db:
            db.execute("DELETE FROM step_watches WHERE expires_at<=?", (now,))
