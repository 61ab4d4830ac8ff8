"""The front's records: request key -> the session it created, attempts, and per-user admission
versions, a repository over the store's engine (store/engine.py). It lives with the front because
its statements are written from the front's transition table (front/attempts.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from provisioner.front.attempts import SETTLED, STICKY, UNSETTLED, Attempt, Event, check_change, sources
from provisioner.model.records import request_key, split_request_key
from provisioner.store.sql import marks, values

if TYPE_CHECKING:
    from provisioner.store import Store

# The front's attempt states; their transitions are the table in front/attempts.py.
PENDING, UNRESOLVED, REFUSED, MADE, NONE = (Attempt.PENDING, Attempt.UNRESOLVED, Attempt.REFUSED, Attempt.MADE,
                                            Attempt.NONE)


class FrontRecords:
    """The front_* tables, whose request_id columns hold request keys (model.request_key: user/request
    id), and user_admissions. Stateless: any number may share one store."""

    def __init__(self, db: Store):
        self._db = db

    def remember_request(self, request_id: str, session_id: str, cluster: str, now: float) -> str | None:
        """Records the first session for a request key; returns whichever session id won. If this
        one won, its attempt takes the WON edge in the same transaction. None: nothing is recorded
        yet and the request's claim holds this one back (its first placement, at another cluster,
        may have answered with a session made there; see schema.py)."""
        with self._db.transaction() as cur:
            cur.execute(self._db.sql("INSERT INTO front_requests (request_id, session_id, cluster, created_at, user_id) "
                                  "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"),
                        (request_id, session_id, cluster, now, split_request_key(request_id)[0]))
            cur.execute(self._db.sql("SELECT session_id FROM front_requests WHERE request_id = ?"), (request_id,))
            row = cur.fetchone()
            winner = row[0] if row else None
            if winner == session_id:
                case, args = _edges(Event.WON)
                cur.execute(self._db.sql(f"UPDATE front_attempts SET outcome = {case} WHERE request_id = ? AND cluster = ? "
                                      f"AND outcome IN ({marks(sources(Event.WON))})"),
                            (*args, request_id, cluster, *values(sources(Event.WON))))
            return winner

    def session_for_request(self, request_id: str) -> str | None:
        rows = self._db.rows("SELECT session_id FROM front_requests WHERE request_id = ?", (request_id,))
        return rows[0][0] if rows else None

    def owner_of_session(self, session_id: str) -> str | None:
        """The user a front made `session_id` for; None for a session no front made (a requeue)."""
        rows = self._db.rows("SELECT user_id FROM front_requests WHERE session_id = ?", (session_id,))
        return rows[0][0] if rows else None

    def note_attempt(self, request_id: str, cluster: str, commit_by: float, admitted: int | None = None) -> Noted | None:
        """The SENT edge: the attempt is pending, with the later commit_by of this one and any earlier
        one there. A made one stays made. Returns the state after, and whether this is the
        request's first attempt anywhere, which claims the request (see schema.py). With
        `admitted` (the user's admission version its quota check read), only if no other attempt
        of the user was recorded since, which it counts as one more; else it writes nothing and
        returns None."""
        edges = {b: a for b, a in sources(Event.SENT).items() if b is not None}
        case, args = _edges(Event.SENT, "front_attempts.outcome", edges)
        user_id = split_request_key(request_id)[0]
        with self._db.transaction() as cur:
            if admitted is not None and not self._admit(cur, user_id, admitted):
                return None
            # The key is the arbiter between replicas: of two first attempts at once, one inserts.
            cur.execute(self._db.sql("INSERT INTO front_claims (request_id, cluster, commit_by) SELECT ?, ?, ? "
                                  "WHERE NOT EXISTS (SELECT 1 FROM front_attempts WHERE request_id = ?) "
                                  "ON CONFLICT DO NOTHING"), (request_id, cluster, commit_by, request_id))
            first = cur.rowcount == 1
            cur.execute(self._db.sql(
                "INSERT INTO front_attempts (request_id, cluster, commit_by, outcome, user_id) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (request_id, cluster) DO UPDATE "
                "SET commit_by = CASE WHEN excluded.commit_by > front_attempts.commit_by "
                f"THEN excluded.commit_by ELSE front_attempts.commit_by END, outcome = {case} "
                f"WHERE front_attempts.outcome IN ({marks(edges)})"),
                (request_id, cluster, commit_by, sources(Event.SENT)[None].value, user_id, *args, *values(edges)))
            cur.execute(self._db.sql("SELECT outcome FROM front_attempts WHERE request_id = ? AND cluster = ?"),
                        (request_id, cluster))
            return Noted(Attempt(cur.fetchone()[0]), first)

    def _admit(self, cur, user_id: str, version: int) -> bool:
        """Moves the user's admission version on from `version`; False if it was not there (a
        row-level compare-and-set: atomic across processes on SQLite and PostgreSQL alike)."""
        if version == 0:
            cur.execute(self._db.sql("INSERT INTO user_admissions (user_id, version) VALUES (?, 1) ON CONFLICT DO NOTHING"),
                        (user_id,))
        else:
            cur.execute(self._db.sql("UPDATE user_admissions SET version = version + 1 WHERE user_id = ? AND version = ?"),
                        (user_id, version))
        return cur.rowcount == 1

    def settle_attempt(self, request_id: str, cluster: str, to: Attempt, expected: Attempt = PENDING,
                       commit_by: float | None = None, waive: bool = False) -> bool:
        """Applies a change the front's state machine chose, if the attempt is still as it decided
        on (`expected`, and `commit_by` when given); False if someone changed it first. `waive`:
        the request's first placement moves on from its claim's cluster without having answered,
        so the claim holds back no other record from now on, whether or not the change applies."""
        check_change(expected, to)
        where, args = "request_id = ? AND cluster = ? AND outcome = ?", [request_id, cluster, expected.value]
        if commit_by is not None:
            where += " AND commit_by = ?"
            args.append(commit_by)
        with self._db.transaction() as cur:
            if waive:
                self._waive(cur, request_id, cluster)
            cur.execute(self._db.sql(f"UPDATE front_attempts SET outcome = ? WHERE {where}"), (to.value, *args))
            return cur.rowcount == 1

    def waive_claim(self, request_id: str, cluster: str) -> None:
        """The claim's placement stopped without answering (its call was cancelled)."""
        with self._db.transaction() as cur:
            self._waive(cur, request_id, cluster)

    def _waive(self, cur, request_id: str, cluster: str) -> None:
        cur.execute(self._db.sql("UPDATE front_claims SET waived = 1 WHERE request_id = ? AND cluster = ?"),
                    (request_id, cluster))

    def prune_attempts(self, before: float) -> None:
        """Forgets settled attempts whose commit_by is older than `before`: their outcome is known.
        And the claims whose attempt has been forgotten: a claim keeps the commit_by its attempt
        was first sent with, never later than the attempt's own."""
        with self._db.transaction() as cur:
            cur.execute(self._db.sql(f"DELETE FROM front_attempts WHERE outcome IN ({marks(SETTLED)}) AND commit_by < ?"),
                        (*values(SETTLED), before))
            cur.execute(self._db.sql("DELETE FROM front_claims WHERE commit_by < ? AND NOT EXISTS (SELECT 1 FROM "
                                  "front_attempts a WHERE a.request_id = front_claims.request_id "
                                  "AND a.cluster = front_claims.cluster)"), (before,))

    def open_attempts(self, request_id: str | None = None) -> list[tuple[str, str, float]]:
        """(request id, cluster, commit_by) of attempts not settled yet, oldest first."""
        return [(r, c, by) for r, c, _, by in self.attempts_to_resolve(request_id)]

    def attempts_to_resolve(self, request_id: str | None = None) -> list[tuple[str, str, Attempt, float]]:
        """(request id, cluster, state, commit_by) of attempts not settled yet, oldest first."""
        where = f"outcome IN ({marks(UNSETTLED)})" + (" AND request_id = ?" if request_id else "")
        args = (*values(UNSETTLED), *((request_id,) if request_id else ()))
        return [(r, c, Attempt(state), by) for r, c, state, by in self._db.rows(
            f"SELECT request_id, cluster, outcome, commit_by FROM front_attempts WHERE {where} "
            "ORDER BY commit_by, request_id, cluster", args)]

    # ---- quotas: what a create's check reads of the user ------------------------------------

    def admission(self, request_id: str, since: float, now: float) -> Admission:
        """What a create's quota check knows of the user of request key `request_id` from the store
        alone, in one statement (one snapshot, one round trip), whatever the user's history: the
        sessions made are summed up in the database (`since`: the week's start). A placement
        recorded after it moves the version on, so its create checks again; one recorded before
        shows as under way, or as made once its record is written."""
        user_id = split_request_key(request_id)[0]

        def within(column: str) -> tuple[str, list[float]]:  # the column's time, held to [since, now]
            return f"CASE WHEN {column} > ? THEN ? WHEN {column} < ? THEN ? ELSE {column} END", [now, now, since, since]

        made_at, made_args = within("created_at")
        ended_at, ended_args = within("ended_at")
        users, user_args = _of_user(user_id)
        # The branch with every column typed comes first: PostgreSQL types a UNION's columns from it.
        rows = self._db.rows(
            "SELECT 'made', '', CAST(SUM(CASE WHEN ended_at IS NULL THEN 1 ELSE 0 END) AS DOUBLE PRECISION), "
            f"CAST(SUM(CASE WHEN ended_at IS NULL THEN ? - {made_at} ELSE 0 END) AS DOUBLE PRECISION), "
            f"CAST(SUM(CASE WHEN ended_at IS NULL THEN 0 ELSE {ended_at} - {made_at} END) AS DOUBLE PRECISION) "
            # Two ranges of the user's index (not seen to end; ended this week), not the history.
            f"FROM (SELECT created_at, ended_at FROM front_requests WHERE {users} AND ended_at IS NULL "
            f"AND request_id <> ? UNION ALL SELECT created_at, ended_at FROM front_requests WHERE {users} "
            "AND ended_at >= ? AND request_id <> ?) m "
            "UNION ALL SELECT 'version', NULL, version, NULL, NULL FROM user_admissions WHERE user_id = ? "
            f"UNION ALL SELECT CASE WHEN outcome IN ({marks(STICKY)}) THEN 'placing' ELSE 'refused' END, request_id, "
            "NULL, NULL, NULL FROM front_attempts a "
            f"WHERE {users} AND outcome IN ({marks(UNSETTLED)}) AND request_id <> ? "
            "AND NOT EXISTS (SELECT 1 FROM front_requests r WHERE r.request_id = a.request_id) "
            "UNION ALL SELECT 'answer', session_id, NULL, NULL, NULL FROM front_requests WHERE request_id = ? "
            "UNION ALL SELECT 'sticky', cluster, NULL, NULL, NULL FROM front_attempts "
            f"WHERE request_id = ? AND outcome IN ({marks(STICKY)})",
            (now, *made_args, *ended_args, *made_args, *user_args, request_id, *user_args, since, request_id,
             user_id, *values(STICKY), *user_args, *values(UNSETTLED), request_id, request_id,
             request_id, *values(STICKY)))
        version, answer, placing, refused, live, live_s, ended_s = 0, None, set(), set(), 0, 0.0, 0.0
        sticky = set()
        for kind, text, a, b, c in rows:
            if kind == "made":
                live, live_s, ended_s = int(a or 0), b or 0.0, c or 0.0
            elif kind == "version":
                version = int(a)
            elif kind in ("placing", "refused"):
                (placing if kind == "placing" else refused).add(split_request_key(text)[1])
            elif kind == "sticky":
                sticky.add(text)
            else:
                answer = text
        return Admission(version, answer, frozenset(placing), frozenset(refused - placing), live, live_s, ended_s,
                         frozenset(sticky))

    def made_not_seen_ended(self, user_id: str) -> list[Made]:
        """The sessions made for the user that no check has seen end yet."""
        users, user_args = _of_user(user_id)
        return [Made(split_request_key(k)[1], sid, c, at) for k, sid, c, at in self._db.rows(
            f"SELECT request_id, session_id, cluster, created_at FROM front_requests WHERE {users} AND ended_at IS NULL",
            tuple(user_args))]

    def mark_ended(self, ended: list[tuple[str, str, float]]) -> None:
        """Records that sessions a check saw (request key, session id, ended by) have ended."""
        with self._db.transaction() as cur:
            for request_id, session_id, ended_at in ended:
                cur.execute(self._db.sql("UPDATE front_requests SET ended_at = ? "
                                      "WHERE request_id = ? AND session_id = ? AND ended_at IS NULL"),
                            (ended_at, request_id, session_id))



class Noted(NamedTuple):
    """An attempt as note_attempt left it."""
    state: Attempt
    first: bool  # the request's first attempt anywhere: its placement holds the request's claim


@dataclass(frozen=True, slots=True)
class Made:
    """A session a front made for one of the user's requests, not seen to end yet."""
    request_id: str
    session_id: str
    cluster: str
    created_at: float


@dataclass(frozen=True)
class Admission:
    version: int  # the user's attempts recorded so far: a create records its own only if unchanged
    answer: str | None  # the session already made for this very request
    placing: frozenset[str]  # request ids of the user's other placements whose outcome is unknown yet
    # ... and of those a cluster refused, not settled yet: a late copy of the Allocate may still
    # make a session there until its commit_by, which only a cluster's list would show
    refused: frozenset[str]
    live: int  # the user's other sessions made and not seen to end
    live_s: float  # their time since made (or since the week began), up to now
    ended_s: float  # the time within the week of those seen to end in it, from made to end
    # clusters where an attempt at this very request may have made its session (attempts.STICKY)
    sticky: frozenset[str] = frozenset()


def _of_user(user_id: str) -> tuple[str, list]:
    """SQL for the rows of `user_id`: those written with the user, and those a front of an earlier
    release writes during a rolling upgrade (no user; the request key begins with it)."""
    prefix = request_key(user_id, "")
    return "(user_id = ? OR (user_id = '' AND substr(request_id, 1, ?) = ?))", [user_id, len(prefix), prefix]


def _edges(event: Event, column: str = "outcome", edges: dict | None = None) -> tuple[str, list[str]]:
    """SQL for the state after `event` from the state in `column`, from the front's transition
    table (never a second copy of it), and its arguments."""
    edges = sources(event) if edges is None else edges
    pairs = sorted((b.value, a.value) for b, a in edges.items() if b is not None)
    return f"CASE {column} {' '.join('WHEN ? THEN ?' for _ in pairs)} END", [v for p in pairs for v in p]

