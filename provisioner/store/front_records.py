"""The front's records: request key -> the session it created, attempts, per-user leases and
quota overrides."""

from __future__ import annotations

import json
from typing import Any

from provisioner.front.attempts import SETTLED, UNSETTLED, Attempt, Event, check_change, sources
from provisioner.store.base import _marks, _values

# The front's attempt states; their transitions are the table in front/attempts.py.
PENDING, UNRESOLVED, REFUSED, MADE, NONE = (Attempt.PENDING, Attempt.UNRESOLVED, Attempt.REFUSED, Attempt.MADE,
                                            Attempt.NONE)


class FrontRecords:
    # ---- the front: request key -> the session it created ---------------------------------
    # The front_* tables' request_id columns hold request keys (model.request_key: user/request id).

    def remember_request(self, request_id: str, session_id: str, cluster: str, now: float) -> str:
        """Records the first session for a request key; returns whichever session id won. If this
        one won, its attempt takes the WON edge in the same transaction."""
        with self.transaction() as cur:
            cur.execute(self._sql("INSERT INTO front_requests VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"),
                        (request_id, session_id, cluster, now))
            cur.execute(self._sql("SELECT session_id FROM front_requests WHERE request_id = ?"), (request_id,))
            winner = cur.fetchone()[0]
            if winner == session_id:
                case, args = _edges(Event.WON)
                cur.execute(self._sql(f"UPDATE front_attempts SET outcome = {case} WHERE request_id = ? AND cluster = ? "
                                      f"AND outcome IN ({_marks(sources(Event.WON))})"),
                            (*args, request_id, cluster, *_values(sources(Event.WON))))
            return winner

    def session_for_request(self, request_id: str) -> str | None:
        rows = self._rows("SELECT session_id FROM front_requests WHERE request_id = ?", (request_id,))
        return rows[0][0] if rows else None

    def note_attempt(self, request_id: str, cluster: str, commit_by: float) -> Attempt:
        """The SENT edge: the attempt is pending, with the later commit_by of this one and any earlier
        one there. A made one stays made. Returns the state after."""
        edges = {b: a for b, a in sources(Event.SENT).items() if b is not None}
        case, args = _edges(Event.SENT, "front_attempts.outcome", edges)
        with self.transaction() as cur:
            cur.execute(self._sql(
                "INSERT INTO front_attempts VALUES (?, ?, ?, ?) ON CONFLICT (request_id, cluster) DO UPDATE "
                "SET commit_by = CASE WHEN excluded.commit_by > front_attempts.commit_by "
                f"THEN excluded.commit_by ELSE front_attempts.commit_by END, outcome = {case} "
                f"WHERE front_attempts.outcome IN ({_marks(edges)})"),
                (request_id, cluster, commit_by, sources(Event.SENT)[None].value, *args, *_values(edges)))
            cur.execute(self._sql("SELECT outcome FROM front_attempts WHERE request_id = ? AND cluster = ?"),
                        (request_id, cluster))
            return Attempt(cur.fetchone()[0])

    def settle_attempt(self, request_id: str, cluster: str, to: Attempt, expected: Attempt = PENDING,
                       commit_by: float | None = None) -> bool:
        """Applies a change the front's state machine chose, if the attempt is still as it decided
        on (`expected`, and `commit_by` when given); False if someone changed it first."""
        check_change(expected, to)
        where, args = "request_id = ? AND cluster = ? AND outcome = ?", [request_id, cluster, expected.value]
        if commit_by is not None:
            where += " AND commit_by = ?"
            args.append(commit_by)
        with self.transaction() as cur:
            cur.execute(self._sql(f"UPDATE front_attempts SET outcome = ? WHERE {where}"), (to.value, *args))
            return cur.rowcount == 1

    def prune_attempts(self, before: float) -> None:
        """Forgets settled attempts whose commit_by is older than `before`: their outcome is known."""
        with self.transaction() as cur:
            cur.execute(self._sql(f"DELETE FROM front_attempts WHERE outcome IN ({_marks(SETTLED)}) AND commit_by < ?"),
                        (*_values(SETTLED), before))

    def open_attempts(self, request_id: str | None = None) -> list[tuple[str, str, float]]:
        """(request id, cluster, commit_by) of attempts not settled yet, oldest first."""
        return [(r, c, by) for r, c, _, by in self.attempts_to_resolve(request_id)]

    def attempts_to_resolve(self, request_id: str | None = None) -> list[tuple[str, str, Attempt, float]]:
        """(request id, cluster, state, commit_by) of attempts not settled yet, oldest first."""
        where = f"outcome IN ({_marks(UNSETTLED)})" + (" AND request_id = ?" if request_id else "")
        args = (*_values(UNSETTLED), *((request_id,) if request_id else ()))
        return [(r, c, Attempt(state), by) for r, c, state, by in self._rows(
            f"SELECT request_id, cluster, outcome, commit_by FROM front_attempts WHERE {where} "
            "ORDER BY commit_by, request_id, cluster", args)]

    # ---- quotas: per-user leases across front replicas, operator overrides ------------------

    def try_user_lease(self, user_id: str, holder: str, expires_at: float, now: float) -> bool:
        """Takes the user's lease for `holder` until `expires_at` if it is free or lapsed (its
        expiry before `now`); whether `holder` has it. Atomic across processes."""
        with self.transaction() as cur:
            cur.execute(self._sql(
                "INSERT INTO user_leases (user_id, holder, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT (user_id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at "
                "WHERE user_leases.expires_at < ?"), (user_id, holder, expires_at, now))
            cur.execute(self._sql("SELECT holder FROM user_leases WHERE user_id = ?"), (user_id,))
            return cur.fetchone()[0] == holder

    def renew_user_lease(self, user_id: str, holder: str, expires_at: float) -> bool:
        """Extends `holder`'s lease; False if it is no longer theirs."""
        with self.transaction() as cur:
            cur.execute(self._sql("UPDATE user_leases SET expires_at = ? WHERE user_id = ? AND holder = ?"),
                        (expires_at, user_id, holder))
            return cur.rowcount == 1

    def release_user_lease(self, user_id: str, holder: str) -> None:
        with self.transaction() as cur:
            cur.execute(self._sql("DELETE FROM user_leases WHERE user_id = ? AND holder = ?"), (user_id, holder))

    def save_quota_override(self, user_id: str, body: dict[str, Any], now: float) -> None:
        """Sets what operators chose for a user's quota; an empty `body` removes it (back to the config)."""
        with self.transaction() as cur:
            if body:
                cur.execute(self._sql(
                    "INSERT INTO quota_overrides (user_id, body, updated_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (user_id) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at"),
                    (user_id, json.dumps(body, sort_keys=True), now))
            else:
                cur.execute(self._sql("DELETE FROM quota_overrides WHERE user_id = ?"), (user_id,))

    def quota_override(self, user_id: str) -> tuple[dict[str, Any], float | None]:
        """What operators set for the user and when ({} and None: nothing)."""
        rows = self._rows("SELECT body, updated_at FROM quota_overrides WHERE user_id = ?", (user_id,))
        return (json.loads(rows[0][0]), rows[0][1]) if rows else ({}, None)


def _edges(event: Event, column: str = "outcome", edges: dict | None = None) -> tuple[str, list[str]]:
    """SQL for the state after `event` from the state in `column`, from the front's transition
    table (never a second copy of it), and its arguments."""
    edges = sources(event) if edges is None else edges
    pairs = sorted((b.value, a.value) for b, a in edges.items() if b is not None)
    return f"CASE {column} {' '.join('WHEN ? THEN ?' for _ in pairs)} END", [v for p in pairs for v in p]

