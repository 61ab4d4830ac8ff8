"""Blocked users and the abuse detector's decisions."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from provisioner.store.engine import Store


class UserBlocks:
    """Blocked users, their history, and the abuse detector's decisions, over the store's engine."""

    def __init__(self, db: Store):
        self._db = db

    def block_user(self, user_id: str, at: float, by: str, reason: str, evidence: str) -> bool:
        """Blocks the user unless already blocked (the first block, its reason and evidence, stand);
        whether this call blocked them."""
        with self._db.transaction() as cur:
            return self._insert_block(cur, user_id, at, by, reason, evidence)

    def _insert_block(self, cur, user_id: str, at: float, by: str, reason: str, evidence: str) -> bool:
        cur.execute(self._db.sql(
            "INSERT INTO user_blocks (user_id, blocked_at, blocked_by, reason, evidence) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (user_id) DO NOTHING"), (user_id, at, by, reason, evidence))
        return cur.rowcount == 1

    def unblock_user(self, user_id: str, at: float, by: str) -> tuple | None:
        """Lifts the user's block, moved to the history with who lifted it and when; the block
        lifted (as `user_block` gives it), or None if the user was not blocked."""
        with self._db.transaction() as cur:
            cur.execute(self._db.sql("SELECT user_id, blocked_at, blocked_by, reason, evidence FROM user_blocks "
                                  "WHERE user_id = ?"), (user_id,))
            row = cur.fetchone()
            if row is None:
                return None
            cur.execute(self._db.sql("INSERT INTO user_block_history (user_id, blocked_at, blocked_by, reason, evidence, "
                                  "lifted_at, lifted_by) VALUES (?, ?, ?, ?, ?, ?, ?)"), (*row, at, by))
            cur.execute(self._db.sql("DELETE FROM user_blocks WHERE user_id = ?"), (user_id,))
            return tuple(row)

    def lifted_blocks(self, user_id: str, limit: int) -> list[tuple]:
        """The user's blocks lifted, newest lifting first: `user_block`'s columns, lifted at, lifted by."""
        return [tuple(r) for r in self._db.rows(
            "SELECT user_id, blocked_at, blocked_by, reason, evidence, lifted_at, lifted_by FROM user_block_history "
            "WHERE user_id = ? ORDER BY lifted_at DESC, blocked_at DESC LIMIT ?", (user_id, limit))]

    def user_block(self, user_id: str) -> tuple | None:
        """(user id, blocked at, by, reason, evidence), or None if the user is not blocked."""
        rows = self._db.rows("SELECT user_id, blocked_at, blocked_by, reason, evidence FROM user_blocks "
                          "WHERE user_id = ?", (user_id,))
        return tuple(rows[0]) if rows else None

    def blocked_users(self, limit: int, offset: int = 0) -> list[tuple]:
        """Blocks as `user_block` gives them, newest first."""
        return [tuple(r) for r in self._db.rows(
            "SELECT user_id, blocked_at, blocked_by, reason, evidence FROM user_blocks "
            "ORDER BY blocked_at DESC, user_id LIMIT ? OFFSET ?", (limit, offset))]

    def record_abuse_decision(self, session_id: str, user_id: str, at: float, rules: str, reason: str,
                              evidence: str, block: bool, by: str) -> bool:
        """The detector's decision on a session, and (`block`) the block of its user by `by`, in
        one transaction. A session's decision is recorded once: a repeat (the same flag delivered
        again) changes nothing, so it never blocks a user an operator has unblocked since. Whether
        the decision was new."""
        with self._db.transaction() as cur:
            cur.execute(self._db.sql(
                "INSERT INTO abuse_decisions (session_id, user_id, at, rules, reason, evidence, blocked) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_id) DO NOTHING"),
                (session_id, user_id, at, rules, reason, evidence, int(block)))
            if cur.rowcount != 1:
                return False
            if block:
                self._insert_block(cur, user_id, at, by, reason, evidence)
            return True

    def abuse_decisions(self, user_id: str, limit: int) -> list[tuple]:
        """(session id, at, rules, reason, evidence, blocked) of the user's flagged sessions, newest first."""
        return [(s, at, rules, reason, evidence, bool(blocked)) for s, at, rules, reason, evidence, blocked in self._db.rows(
            "SELECT session_id, at, rules, reason, evidence, blocked FROM abuse_decisions WHERE user_id = ? "
            "ORDER BY at DESC, session_id LIMIT ?", (user_id, limit))]
