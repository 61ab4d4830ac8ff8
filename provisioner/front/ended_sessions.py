"""What a front remembers of each user's ended sessions, so a quota check lists only what changed.

A quota check needs every session of the user this week, on every cluster. A session that has
ended never changes again (as far as metering goes: its interval and kind), so a front keeps the
metering row of each ended session it has seen and asks each cluster only for the live sessions
and those that ended since the latest end it has seen there (less a margin, should the cluster's
clock step back; a session seen twice is kept once). The cost of a check then follows what
changed since the last one, not the user's whole week. The budget sweep lists each cluster for
every user at once (live sessions, and those that ended since its last sweep there), which
carries forward what is known of every user remembered (`extend`), so a user's week is then
known without listing them at all. Rows older than the week asked for are
dropped, and users not checked for a while are forgotten first when the cache is full; a user
forgotten is read whole again. Each front replica keeps its own: it is a cache, never the truth.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from provisioner.rules.quota import Row

# Sessions that ended this long before the latest end seen are asked for again.
CLOCK_MARGIN_S = 60.0
MAX_USERS = 10_000


@dataclass
class _Seen:
    """One user's ended sessions on one cluster."""

    latest_end: float = float("-inf")
    covered: float = float("-inf")  # every end before this is in rows: when the list was asked
    rows: dict[str, Row] = field(default_factory=dict)  # session id -> its row


class EndedSessions:
    def __init__(self, max_users: int = MAX_USERS):
        self.max_users = max_users
        self._users: OrderedDict[str, dict[str, _Seen]] = OrderedDict()

    def ask_after(self, user_id: str, cluster: str, week_start: float) -> float:
        """What to ask the cluster for: sessions live, or ended at or after this."""
        seen = self._users.get(user_id, {}).get(cluster)
        if seen is None:
            return week_start
        return max(week_start, max(seen.latest_end, seen.covered) - CLOCK_MARGIN_S)

    def covered(self, user_id: str, cluster: str) -> float:
        """Every end of the user's sessions on `cluster` before this is remembered (-inf: none is)."""
        seen = self._users.get(user_id, {}).get(cluster)
        return float("-inf") if seen is None else seen.covered

    def add(self, user_id: str, cluster: str, ended: list[tuple[str, float, Row]],
            asked_at: float | None = None) -> None:
        """Remembers the ended sessions (id, end, row) a cluster listed, in full, for what
        `ask_after` asked, when the list was asked for at `asked_at`."""
        clusters = self._users.get(user_id)
        if clusters is None:
            clusters = self._users[user_id] = {}
            while len(self._users) > self.max_users:
                self._users.popitem(last=False)
        self._users.move_to_end(user_id)
        seen = clusters.setdefault(cluster, _Seen())
        _remember(seen, ended)
        if asked_at is not None:
            seen.covered = max(seen.covered, asked_at)

    def extend(self, cluster: str, complete_from: float, asked_at: float,
               ended: dict[str, list[tuple[str, float, Row]]]) -> None:
        """Takes in a list of every user's sessions on `cluster`, asked for at `asked_at`, that
        holds every end since `complete_from` (`ended`: by user). A user remembered without a gap
        before `complete_from` is then known up to `asked_at`; the others are left as they are,
        and not added."""
        for user_id, clusters in self._users.items():
            seen = clusters.get(cluster)
            if seen is not None and seen.covered >= complete_from:
                _remember(seen, ended.get(user_id, ()))
                seen.covered = max(seen.covered, asked_at)

    def rows(self, user_id: str, cluster: str, week_start: float) -> list[Row]:
        """The ended sessions remembered, those that ended before the week dropped."""
        seen = self._users.get(user_id, {}).get(cluster)
        if seen is None:
            return []
        old = [sid for sid, r in seen.rows.items() if r.metered.ended_at is not None and r.metered.ended_at < week_start]
        for sid in old:
            del seen.rows[sid]
        return list(seen.rows.values())


def _remember(seen: _Seen, ended) -> None:
    for sid, ended_at, row in ended:
        seen.rows[sid] = row
        seen.latest_end = max(seen.latest_end, ended_at)
