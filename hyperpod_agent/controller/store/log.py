"""The intent log and what it accounts for: actions, tracked jobs and events.

Actions and tracked jobs commit durably: they are what makes a crash between "decide"
and "apply" yield exactly one action (store/sqlite.py, store/postgres.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hyperpod_agent.controller.store.dialect import Tx
from hyperpod_agent.controller.store.lease import Lease, LeaseLog
from hyperpod_agent.controller.store.rows import ActionRow, EventIn, EventRow, TrackedJob
from hyperpod_agent.text import printable

# An event is read by people: a message longer than this is cut (a job name can be 10 kB).
MAX_MESSAGE = 2000
MAX_CAUSE = 500

_JOB_COLUMNS = [c.strip() for c in TrackedJob.COLUMNS.split(",")]
# An upsert both databases take (SQLite's INSERT OR REPLACE is not PostgreSQL).
_PUT_JOB = (
    f"INSERT INTO jobs ({TrackedJob.COLUMNS}) VALUES ({','.join('?' * len(_JOB_COLUMNS))}) "
    "ON CONFLICT(job_id) DO UPDATE SET "
    + ", ".join(f"{c}=excluded.{c}" for c in _JOB_COLUMNS if c != "job_id")
)


class ActionLog(LeaseLog):
    """Actions, tracked jobs, events and the pruning of their history."""

    def add_action(
        self,
        kind: str,
        node: str | None,
        job_id: int | None,
        reason: str,
        cause: str,
        now: float,
        params: dict[str, Any] | None = None,
        *,
        fence: Lease | None = None,
    ) -> int:
        """Record an intent durably (fsync) before anything touches Slurm; with
        ``fence``, only while that lease is still held (else LeaseLost, nothing
        written)."""
        with self._tx(durable=True) as db:
            if fence is not None:
                self._check_fence(db, fence, now)
            cur = db.execute(
                "INSERT INTO actions (kind, node, job_id, reason, cause, params, state, "
                "created_at, updated_at, next_attempt_at) VALUES (?,?,?,?,?,?,'intent',?,?,?) "
                "RETURNING id",
                (kind, node, job_id, reason, cause, json.dumps(params or {}), now, now, now),
            )
            return int(cur.fetchone()[0])

    @staticmethod
    def _set_action(
        db: Tx,
        action_id: int,
        state: str,
        now: float,
        attempts: int | None,
        error: str | None,
        next_attempt_at: float | None,
        params: dict[str, Any] | None,
    ) -> None:
        db.execute(
            "UPDATE actions SET state=?, updated_at=?, attempts=coalesce(?, attempts), "
            "error=coalesce(?, error), next_attempt_at=coalesce(?, next_attempt_at), "
            "params=coalesce(?, params) WHERE id=?",
            (
                state,
                now,
                attempts,
                error,
                next_attempt_at,
                None if params is None else json.dumps(params),
                action_id,
            ),
        )

    def update_action(
        self,
        action_id: int,
        state: str,
        now: float,
        *,
        attempts: int | None = None,
        error: str | None = None,
        next_attempt_at: float | None = None,
        params: dict[str, Any] | None = None,
        job: TrackedJob | None = None,
        events: Sequence[EventIn] = (),
        fence: Lease | None = None,
    ) -> None:
        """An action's new state, with the job accounting it implies and its events, in
        one durable transaction: a crash leaves all of them or none. With ``fence``,
        only while that lease is still held (else LeaseLost, nothing written)."""
        with self._tx(durable=True) as db:
            if fence is not None:
                self._check_fence(db, fence, now)
            self._set_action(db, action_id, state, now, attempts, error, next_attempt_at, params)
            if job is not None:
                self._put_job(db, job)
            for ev in events:
                self._put_event(db, ev, now)

    def action(self, action_id: int) -> ActionRow | None:
        rows = self._query(f"SELECT {ActionRow.COLUMNS} FROM actions WHERE id=?", (action_id,))
        return ActionRow.from_row(rows[0]) if rows else None

    def open_actions(self) -> list[ActionRow]:
        rows = self._query(
            f"SELECT {ActionRow.COLUMNS} FROM actions WHERE state IN ('intent','applied') "
            "ORDER BY id"
        )
        return [ActionRow.from_row(r) for r in rows]

    def node_actions(self, node: str, limit: int = 100) -> list[ActionRow]:
        rows = self._query(
            f"SELECT {ActionRow.COLUMNS} FROM actions WHERE node=? ORDER BY id DESC LIMIT ?",
            (node, limit),
        )
        return [ActionRow.from_row(r) for r in rows]

    def job_actions(self, job_id: int, limit: int = 100) -> list[ActionRow]:
        rows = self._query(
            f"SELECT {ActionRow.COLUMNS} FROM actions WHERE job_id=? ORDER BY id DESC LIMIT ?",
            (job_id, limit),
        )
        return [ActionRow.from_row(r) for r in rows]

    def last_done(self, node: str, kind: str) -> float | None:
        rows = self._query(
            "SELECT max(updated_at) FROM actions WHERE node=? AND kind=? AND state='done'",
            (node, kind),
        )
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    def done_since(self, since: float) -> list[ActionRow]:
        rows = self._query(
            f"SELECT {ActionRow.COLUMNS} FROM actions WHERE state='done' AND updated_at>=? "
            "ORDER BY id",
            (since,),
        )
        return [ActionRow.from_row(r) for r in rows]

    def replaced_nodes(self) -> frozenset[str]:
        """Nodes whose latest replacement completed with a spare taking their place."""
        rows = self._query(
            "SELECT a.node, a.params FROM actions a JOIN (SELECT node, max(id) AS id "
            "FROM actions WHERE kind='replace' AND node IS NOT NULL GROUP BY node) m "
            "ON a.id = m.id WHERE a.state='done'"
        )
        return frozenset(
            str(node) for node, params in rows if params and json.loads(params).get("spare")
        )

    def actions_since(self, kind: str, since: float) -> int:
        rows = self._query(
            "SELECT count(*) FROM actions WHERE kind=? AND created_at>=? "
            "AND state IN ('intent','applied','done')",
            (kind, since),
        )
        return int(rows[0][0])

    # -- tracked jobs ---------------------------------------------------------------
    def upsert_job(self, job: TrackedJob, events: Sequence[EventIn] = (), now: float = 0.0) -> None:
        """Store a tracked job (and the events that say why) in one transaction."""
        with self._tx(durable=True) as db:
            self._put_job(db, job)
            for ev in events:
                self._put_event(db, ev, now)

    @staticmethod
    def _put_job(db: Tx, job: TrackedJob) -> None:
        db.execute(_PUT_JOB, job.to_row())

    def jobs(self) -> dict[int, TrackedJob]:
        rows = self._query(f"SELECT {TrackedJob.COLUMNS} FROM jobs ORDER BY job_id")
        return {int(r[0]): TrackedJob.from_row(r) for r in rows}

    def job(self, job_id: int) -> TrackedJob | None:
        rows = self._query(f"SELECT {TrackedJob.COLUMNS} FROM jobs WHERE job_id=?", (job_id,))
        return TrackedJob.from_row(rows[0]) if rows else None

    def prune(self, before: float) -> int:
        """Forget history older than ``before``: events, closed faults, finished actions
        and jobs. Open faults and open intents are never pruned."""
        with self._tx() as db:
            removed = db.execute("DELETE FROM events WHERE at<?", (before,)).rowcount
            removed += db.execute(
                "DELETE FROM faults WHERE closed_at IS NOT NULL AND closed_at<?", (before,)
            ).rowcount
            removed += db.execute(
                "DELETE FROM actions WHERE state IN ('done','failed','abandoned') AND updated_at<?",
                (before,),
            ).rowcount
            removed += db.execute(
                "DELETE FROM jobs WHERE state IN ('done','exhausted','failed') AND updated_at<?",
                (before,),
            ).rowcount
            removed += db.execute("DELETE FROM findings WHERE at<?", (before,)).rowcount
            removed += db.execute(
                "DELETE FROM deep_checks WHERE phase='done' AND updated_at<?", (before,)
            ).rowcount
            removed += db.execute("DELETE FROM deep_check_results WHERE at<?", (before,)).rowcount
            removed += db.execute(
                "DELETE FROM step_retries WHERE phase IN ('done','failed') AND updated_at<?",
                (before,),
            ).rowcount
        return removed

    # -- events ---------------------------------------------------------------------
    def add_event(
        self,
        kind: str,
        message: str,
        now: float,
        *,
        node: str | None = None,
        job_id: int | None = None,
        cause: str = "",
    ) -> int:
        with self._tx() as db:
            return self._put_event(db, EventIn(kind, message, node, job_id, cause), now)

    @staticmethod
    def _put_event(db: Tx, ev: EventIn, now: float) -> int:
        cur = db.execute(
            "INSERT INTO events (at, kind, node, job_id, cause, message) VALUES (?,?,?,?,?,?) "
            "RETURNING id",
            # what users wrote (job names, reasons) reaches events: printable and bounded
            (
                now,
                ev.kind,
                ev.node,
                ev.job_id,
                printable(ev.cause, MAX_CAUSE),
                printable(ev.message, MAX_MESSAGE),
            ),
        )
        return int(cur.fetchone()[0])

    def events(
        self,
        since_id: int = 0,
        node: str | None = None,
        limit: int = 100,
        job_id: int | None = None,
        since_at: float | None = None,
        kind: str | None = None,
    ) -> list[EventRow]:
        sql = f"SELECT {EventRow.COLUMNS} FROM events WHERE id>?"
        args: list[Any] = [since_id]
        if since_at is not None:
            sql += " AND at>?"
            args.append(since_at)
            since_id = max(since_id, 1)  # page forward from the oldest match
        if node is not None:
            sql += " AND node=?"
            args.append(node)
        if job_id is not None:
            sql += " AND job_id=?"
            args.append(job_id)
        if kind is not None:
            sql += " AND kind=?"
            args.append(kind)
        # With ``since`` page forward (oldest first); without, the newest ``limit``.
        sql += " ORDER BY id ASC LIMIT ?" if since_id > 0 else " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        rows = self._query(sql, tuple(args))
        return [EventRow.from_row(r) for r in (rows if since_id > 0 else reversed(rows))]
