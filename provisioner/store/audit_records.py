"""The audit log."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from provisioner.store.engine import Store


class AuditRecords:
    """The audit log's rows, over the store's engine (store/audit_log.py writes and prunes them)."""

    def __init__(self, db: Store):
        self._db = db

    def append_audit(self, record_id: str, source: str, at: float, identity: str, roles: str, rpc: str,
                     method: str, target: str, outcome: str, detail: str, peer: str = "") -> None:
        """One record; `method` is the RPC's last part (DrainCluster), for filtering by it."""
        with self._db.transaction() as cur:
            cur.execute(self._db.sql(
                "INSERT INTO audit_log (id, source, at, identity, roles, rpc, method, target, outcome, detail, peer) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
                (record_id, source, at, identity, roles, rpc, method, target, outcome, detail, peer))

    def prune_audit(self, source: str, before: float) -> None:
        """Drops one source's records older than `before` (a range of its index)."""
        with self._db.transaction() as cur:
            cur.execute(self._db.sql("DELETE FROM audit_log WHERE source = ? AND at < ?"), (source, before))

    def audit_records(self, source: str, *, identity: str | None = None, rpc: str | None = None,
                      method: str | None = None, outcome: str | None = None, since: float | None = None, until: float | None = None,
                      before: tuple[float, str] | None = None, limit: int = 50) -> list[tuple]:
        """(id, at, identity, roles, rpc, target, outcome, detail, peer) of one source's records, newest
        first: at >= since, at < until, and strictly older than `before` (at, id) when given."""
        where, args = ["source = ?"], [source]
        for column, value in (("identity", identity), ("rpc", rpc), ("method", method), ("outcome", outcome)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if since is not None:
            where.append("at >= ?")
            args.append(since)
        if until is not None:
            where.append("at < ?")
            args.append(until)
        if before is not None:
            where.append("(at < ? OR (at = ? AND id < ?))")
            args += [before[0], before[0], before[1]]
        return [tuple(r) for r in self._db.rows(
            "SELECT id, at, identity, roles, rpc, target, outcome, detail, peer FROM audit_log "
            f"WHERE {' AND '.join(where)} ORDER BY at DESC, id DESC LIMIT ?", (*args, limit))]
