"""The controller's state: SQLite in WAL mode, one connection, explicit transactions.

Durability: with WAL, ``synchronous=NORMAL`` keeps every committed transaction across
a process crash (kill -9): the WAL frames are already in the OS page cache. It can lose
the last commits on a power loss. That is acceptable for reports, heartbeats and events
(agents resend; the loop re-reads Slurm), so they commit with NORMAL. Actions and
tracked jobs are the intent log that makes a crash between "decide" and "apply" yield
exactly one action, so they commit with ``synchronous=FULL`` (fsync of the WAL on
every commit); they are rare, so the cost is nil.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hyperpod_agent.controller.store_rows import (
    ActionRow,
    EventIn,
    EventRow,
    FaultIn,
    FaultRow,
    NodeRow,
    TrackedJob,
)
from hyperpod_agent.controller.store_schema import MIGRATIONS
from hyperpod_agent.errors import ConfigError

OPEN_STATES = ("intent", "applied")


class Store:
    """All controller state. Thread-safe: one connection behind a lock."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            if str(path) != ":memory:":
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(path), isolation_level=None, check_same_thread=False, timeout=30.0
            )
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"{path}: cannot open state database: {exc}") from exc
        self._lock = threading.RLock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self.migrate()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self, durable: bool = False) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if durable:
                self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                # Also when COMMIT itself fails (disk full, I/O error, a deferred
                # constraint): a transaction left open would fail every later write.
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            finally:
                if durable:
                    self._db.execute("PRAGMA synchronous=NORMAL")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    # -- schema ---------------------------------------------------------------------
    def schema_version(self) -> int:
        rows = self._query(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='schema_version'"
        )
        if not rows:
            return 0
        got = self._query("SELECT version FROM schema_version")
        return int(got[0][0]) if got else 0

    def migrate(self, migrations: list[str] | None = None) -> int:
        """Apply every migration newer than the database, each in its own transaction."""
        steps = MIGRATIONS if migrations is None else migrations
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER)")
            current = self.schema_version()
            if current > len(steps):
                raise ConfigError(
                    f"{self.path}: schema version {current} is newer than this controller "
                    f"({len(steps)}); refusing to downgrade"
                )
            for version in range(current + 1, len(steps) + 1):
                with self._tx(durable=True) as db:
                    for statement in steps[version - 1].split(";"):
                        if statement.strip():
                            db.execute(statement)
                    db.execute("DELETE FROM schema_version")
                    db.execute("INSERT INTO schema_version VALUES (?)", (version,))
            return self.schema_version()

    # -- nodes and faults -----------------------------------------------------------
    def node_row(self, name: str) -> NodeRow | None:
        rows = self._query(f"SELECT {NodeRow.COLUMNS} FROM nodes WHERE name=?", (name,))
        return NodeRow.from_row(rows[0]) if rows else None

    def node_rows(self) -> dict[str, NodeRow]:
        rows = self._query(f"SELECT {NodeRow.COLUMNS} FROM nodes ORDER BY name")
        return {r[0]: NodeRow.from_row(r) for r in rows}

    def record_report(
        self,
        node: str,
        agent_id: str,
        seq: int,
        generated_at: float,
        verdict: str,
        report_json: str,
        faults: list[FaultIn],
        now: float,
        jobs_opted_in: str = "{}",
        keep: frozenset[tuple[str, str]] = frozenset(),
        keep_probes: frozenset[str] = frozenset(),
    ) -> tuple[list[FaultRow], list[FaultRow]]:
        """Store a report and reconcile the node's open faults with what it lists.

        An open fault not in ``faults`` is closed, unless the report still shows it
        without confirming it (``keep``: e.g. a restarted agent counting strikes again)
        or its probe could not look this time (``keep_probes``: UNKNOWN). Returns
        (faults opened now, faults closed now).
        """
        opened: list[FaultRow] = []
        closed: list[FaultRow] = []
        with self._tx() as db:
            db.execute(
                "INSERT INTO nodes (name, agent_id, seq, generated_at, received_at, verdict, "
                "report, heartbeat_at, jobs_opted_in) VALUES (?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT(name) DO UPDATE SET "
                "agent_id=excluded.agent_id, seq=excluded.seq, generated_at=excluded.generated_at,"
                " received_at=excluded.received_at, verdict=excluded.verdict, "
                "report=excluded.report, heartbeat_at=excluded.heartbeat_at, "
                "jobs_opted_in=excluded.jobs_opted_in",
                (node, agent_id, seq, generated_at, now, verdict, report_json, now, jobs_opted_in),
            )
            current = {
                (f.component, f.code): f
                for f in (
                    FaultRow.from_row(r)
                    for r in db.execute(
                        f"SELECT {FaultRow.COLUMNS} FROM faults WHERE node=? AND closed_at IS NULL",
                        (node,),
                    )
                )
            }
            seen = set()
            for f in faults:
                key = (f.component, f.code)
                seen.add(key)
                if key in current:
                    db.execute(
                        "UPDATE faults SET last_seen=?, count=count+1, severity=?, action=?, "
                        "urgent=?, message=? WHERE id=?",
                        (
                            generated_at,
                            f.severity,
                            f.action,
                            int(f.urgent),
                            f.message,
                            current[key].id,
                        ),
                    )
                    continue
                cur = db.execute(
                    "INSERT INTO faults (node, component, code, severity, action, urgent, "
                    "first_seen, last_seen, count, message, probe) "
                    "VALUES (?,?,?,?,?,?,?,?,1,?,?)",
                    (
                        node,
                        f.component,
                        f.code,
                        f.severity,
                        f.action,
                        int(f.urgent),
                        generated_at,
                        generated_at,
                        f.message,
                        f.probe,
                    ),
                )
                opened.append(
                    FaultRow(
                        int(cur.lastrowid or 0),
                        node,
                        f.component,
                        f.code,
                        f.severity,
                        f.action,
                        f.urgent,
                        generated_at,
                        generated_at,
                        1,
                        f.message,
                        None,
                        f.probe,
                    )
                )
            for key, row in current.items():
                if key not in seen and key not in keep and row.probe not in keep_probes:
                    db.execute("UPDATE faults SET closed_at=? WHERE id=?", (generated_at, row.id))
                    closed.append(row)
        return opened, closed

    def record_heartbeats(self, beats: dict[str, tuple[str, int, float]]) -> None:
        """Persist a batch of heartbeats: node -> (agent_id, seq, received_at)."""
        if not beats:
            return
        with self._tx() as db:
            db.executemany(
                "INSERT INTO nodes (name, hb_agent_id, hb_seq, heartbeat_at) VALUES (?,?,?,?) "
                "ON CONFLICT(name) DO UPDATE SET hb_agent_id=excluded.hb_agent_id, "
                "hb_seq=excluded.hb_seq, heartbeat_at=max(coalesce(heartbeat_at, 0), "
                "excluded.heartbeat_at)",
                [(n, a, s, t) for n, (a, s, t) in beats.items()],
            )

    def open_faults(self) -> list[FaultRow]:
        rows = self._query(
            f"SELECT {FaultRow.COLUMNS} FROM faults WHERE closed_at IS NULL ORDER BY id"
        )
        return [FaultRow.from_row(r) for r in rows]

    def faults_since(self, since: float) -> list[FaultRow]:
        """Faults first seen at or after ``since`` (open or closed): the history."""
        rows = self._query(
            f"SELECT {FaultRow.COLUMNS} FROM faults WHERE first_seen>=? ORDER BY id", (since,)
        )
        return [FaultRow.from_row(r) for r in rows]

    def node_faults(self, node: str, limit: int = 100) -> list[FaultRow]:
        rows = self._query(
            f"SELECT {FaultRow.COLUMNS} FROM faults WHERE node=? ORDER BY id DESC LIMIT ?",
            (node, limit),
        )
        return [FaultRow.from_row(r) for r in rows]

    # -- actions (the intent log) ---------------------------------------------------
    def add_action(
        self,
        kind: str,
        node: str | None,
        job_id: int | None,
        reason: str,
        cause: str,
        now: float,
        params: dict[str, Any] | None = None,
    ) -> int:
        """Record an intent durably (fsync) before anything touches Slurm."""
        with self._tx(durable=True) as db:
            cur = db.execute(
                "INSERT INTO actions (kind, node, job_id, reason, cause, params, state, "
                "created_at, updated_at, next_attempt_at) VALUES (?,?,?,?,?,?,'intent',?,?,?)",
                (kind, node, job_id, reason, cause, json.dumps(params or {}), now, now, now),
            )
            return int(cur.lastrowid or 0)

    @staticmethod
    def _set_action(
        db: sqlite3.Connection,
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
    ) -> None:
        """An action's new state, with the job accounting it implies and its events, in
        one durable transaction: a crash leaves all of them or none."""
        with self._tx(durable=True) as db:
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
    def _put_job(db: sqlite3.Connection, job: TrackedJob) -> None:
        db.execute(
            f"INSERT OR REPLACE INTO jobs ({TrackedJob.COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)",
            job.to_row(),
        )

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
    def _put_event(db: sqlite3.Connection, ev: EventIn, now: float) -> int:
        cur = db.execute(
            "INSERT INTO events (at, kind, node, job_id, cause, message) VALUES (?,?,?,?,?,?)",
            (now, ev.kind, ev.node, ev.job_id, ev.cause, ev.message),
        )
        return int(cur.lastrowid or 0)

    def events(
        self,
        since_id: int = 0,
        node: str | None = None,
        limit: int = 100,
        job_id: int | None = None,
        since_at: float | None = None,
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
        # With ``since`` page forward (oldest first); without, the newest ``limit``.
        sql += " ORDER BY id ASC LIMIT ?" if since_id > 0 else " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        rows = self._query(sql, tuple(args))
        return [EventRow.from_row(r) for r in (rows if since_id > 0 else reversed(rows))]
