"""Hangs and stragglers the controller declared: one row each, with its event, so a
declaration survives a restart and is never made twice (DESIGN §12)."""

from __future__ import annotations

from hyperpod_agent.controller.store.log import ActionLog
from hyperpod_agent.controller.store.rows import EventIn, FindingRow


class FindingLog(ActionLog):
    def add_finding(self, finding: FindingRow, event: EventIn) -> bool:
        """Record ``finding`` and its event in one transaction; False (and nothing
        written) when the same finding was declared before."""
        with self._tx(durable=True) as db:
            cur = db.execute(
                "INSERT INTO findings (kind, job_id, restart_count, node, step, detail, at) "
                "VALUES (?,?,?,?,?,?,?) ON CONFLICT DO NOTHING RETURNING id",
                (
                    finding.kind,
                    finding.job_id,
                    finding.restart_count,
                    finding.node,
                    finding.step,
                    finding.detail,
                    finding.at,
                ),
            )
            if cur.fetchone() is None:
                return False
            self._put_event(db, event, finding.at)
        return True

    def findings_since(self, since: float) -> list[FindingRow]:
        rows = self._query(
            f"SELECT {FindingRow.COLUMNS} FROM findings WHERE at>=? ORDER BY id", (since,)
        )
        return [FindingRow.from_row(r) for r in rows]

    def job_findings(self, job_id: int, limit: int = 100) -> list[FindingRow]:
        rows = self._query(
            f"SELECT {FindingRow.COLUMNS} FROM findings WHERE job_id=? ORDER BY id DESC LIMIT ?",
            (job_id, limit),
        )
        return [FindingRow.from_row(r) for r in rows]

    def node_findings(self, node: str, limit: int = 100) -> list[FindingRow]:
        rows = self._query(
            f"SELECT {FindingRow.COLUMNS} FROM findings WHERE node=? ORDER BY id DESC LIMIT ?",
            (node, limit),
        )
        return [FindingRow.from_row(r) for r in rows]
