"""The controller's state: a SQLite or PostgreSQL database (store/database.py), the intent log
with jobs and events (store/log.py), and here the nodes' reports and faults."""

from __future__ import annotations

from hyperpod_agent.controller.store.rows import FaultIn, FaultRow, NodeRow
from hyperpod_agent.controller.store.schema import MIGRATIONS
from hyperpod_agent.controller.store.steps import StepLog

__all__ = ["MIGRATIONS", "Store"]


class Store(StepLog):
    """All controller state. Thread-safe."""

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
        progress: str = "[]",
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
                "report, heartbeat_at, jobs_opted_in, progress) VALUES (?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT(name) DO UPDATE SET "
                "agent_id=excluded.agent_id, seq=excluded.seq, generated_at=excluded.generated_at,"
                " received_at=excluded.received_at, verdict=excluded.verdict, "
                "report=excluded.report, heartbeat_at=excluded.heartbeat_at, "
                "jobs_opted_in=excluded.jobs_opted_in, progress=excluded.progress",
                (
                    node,
                    agent_id,
                    seq,
                    generated_at,
                    now,
                    verdict,
                    report_json,
                    now,
                    jobs_opted_in,
                    progress,
                ),
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
                    "VALUES (?,?,?,?,?,?,?,?,1,?,?) RETURNING id",
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
                        int(cur.fetchone()[0]),
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
                "hb_seq=excluded.hb_seq, heartbeat_at=CASE WHEN coalesce(nodes.heartbeat_at, 0) "
                "> excluded.heartbeat_at THEN nodes.heartbeat_at ELSE excluded.heartbeat_at END",
                [(n, a, s, t) for n, (a, s, t) in beats.items()],
            )

    def open_faults(self) -> list[FaultRow]:
        rows = self._query(
            f"SELECT {FaultRow.COLUMNS} FROM faults WHERE closed_at IS NULL ORDER BY id"
        )
        return [FaultRow.from_row(r) for r in rows]

    def burst_peers(self, window: float) -> list[FaultRow]:
        """Closed faults whose code an open fault shows, first seen within ``window``
        of it: the rest of a burst once some of its nodes recovered."""
        # Driven from the open faults (few, indexed; CROSS JOIN fixes the order) through
        # the first_seen index: the cost follows the open faults, not the history.
        cols = ", ".join(f"f.{c.strip()}" for c in FaultRow.COLUMNS.split(","))
        rows = self._query(
            f"SELECT DISTINCT {cols} FROM faults o CROSS JOIN faults f INDEXED BY faults_seen "
            "ON f.first_seen BETWEEN o.first_seen - ? AND o.first_seen + ? "
            "AND f.code = o.code AND f.closed_at IS NOT NULL "
            "WHERE o.closed_at IS NULL ORDER BY f.id",
            (window, window),
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
