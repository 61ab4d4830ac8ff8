"""What operators set that outlives the processes: a cluster's drain flag and pool policy
overrides, and a user's quota overrides, each as JSON."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from provisioner.store.engine import Store


class OperatorRecords:
    def __init__(self, db: Store):
        self._db = db

    def save_operator_state(self, cluster: str, pool: str, body: dict[str, Any], now: float) -> None:
        """Sets what operators chose for the cluster (`pool` '') or one of its pools; an empty
        `body` removes it (back to the config file)."""
        with self._db.transaction() as cur:
            if body:
                cur.execute(self._db.sql(
                    "INSERT INTO operator_state (cluster, pool, body, updated_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (cluster, pool) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at"),
                    (cluster, pool, json.dumps(body, sort_keys=True), now))
            else:
                cur.execute(self._db.sql("DELETE FROM operator_state WHERE cluster = ? AND pool = ?"), (cluster, pool))

    def load_operator_state(self, cluster: str) -> dict[str, dict[str, Any]]:
        """pool -> what operators set on it ('' for the cluster itself)."""
        rows = self._db.rows("SELECT pool, body FROM operator_state WHERE cluster = ?", (cluster,))
        return {pool: json.loads(body) for pool, body in rows}

    def save_quota_override(self, user_id: str, body: dict[str, Any], now: float) -> None:
        """Sets what operators chose for a user's quota; an empty `body` removes it (back to the config)."""
        with self._db.transaction() as cur:
            if body:
                cur.execute(self._db.sql(
                    "INSERT INTO quota_overrides (user_id, body, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (user_id) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at"),
                    (user_id, json.dumps(body, sort_keys=True), now))
            else:
                cur.execute(self._db.sql("DELETE FROM quota_overrides WHERE user_id = ?"), (user_id,))

    def quota_override(self, user_id: str) -> tuple[dict[str, Any], float | None]:
        """What operators set for the user and when ({} and None: nothing)."""
        rows = self._db.rows("SELECT body, updated_at FROM quota_overrides WHERE user_id = ?", (user_id,))
        return (json.loads(rows[0][0]), rows[0][1]) if rows else ({}, None)
