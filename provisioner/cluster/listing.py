"""A cluster's sessions in memory, indexed for keyset pages (provisioner/api/keyset.py): each
user's in key order, and each user's live ones, so that a page of a user's list reads about a
page of rows however many sessions the user has in memory."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Mapping

from provisioner.api.keyset import Key, Part
from provisioner.model.states import SESSION_TERMINAL
from provisioner.model.records import Session, SessionState, created_ns

# Rows a page may walk past without a match (a state or time filter) before it answers with what
# it found and where it stopped: a page's cost stays bounded whatever the filter.
MAX_WALK = 2000


def session_key(s: Session) -> Key:
    return created_ns(s.created_at), s.id


@dataclass(frozen=True)
class Filter:
    """What a list asks for besides its user: states (empty: every state) and a creation window
    in ns ([created_after, created_before), either end open when None)."""

    states: frozenset[SessionState] = frozenset()
    created_after: int | None = None
    created_before: int | None = None

    def matches(self, s: Session, key: Key) -> bool:
        return (not self.states or s.state in self.states) and \
            (self.created_before is None or key[0] < self.created_before)

    def in_window(self, key: Key) -> bool:
        return not self.below_window(key) and (self.created_before is None or key[0] < self.created_before)

    def below_window(self, key: Key) -> bool:
        """Whether this key and every one after it are older than the window."""
        return self.created_after is not None and key[0] < self.created_after

    @property
    def live_only(self) -> bool:
        return bool(self.states) and not self.states & SESSION_TERMINAL


class SessionIndex:
    """Keys of the sessions in `held` (the core's sessions in memory) by user, ascending, and
    the ids of each user's live sessions. Sessions that left `held` are dropped from a user's
    keys as a page walks past them, and from the oldest end as the user makes new ones."""

    def __init__(self, held: Mapping[str, Session]):
        self._held = held
        self._keys: dict[str, list[Key]] = {}
        self._indexed: dict[str, Key] = {}
        self._live: dict[str, set[str]] = {}
        self.rows_read = 0  # rows a page walked, in all: what a page costs, for tests and spans

    def note(self, sessions: Iterable[Session]) -> None:
        """Indexes new sessions and follows their states."""
        for s in sessions:
            user = s.spec.user_id
            if s.id not in self._indexed:
                key = self._indexed[s.id] = session_key(s)
                keys = self._keys.setdefault(user, [])
                bisect.insort(keys, key)
                self._drop_gone_oldest(keys)
            live = self._live.setdefault(user, set())
            if s.state in SESSION_TERMINAL:
                live.discard(s.id)
            else:
                live.add(s.id)

    def user_ids(self, user_id: str) -> list[str]:
        """The user's sessions in memory (pruning those that left it)."""
        keys = self._keys.get(user_id, [])
        keys[:] = [k for k in keys if self._still_held(k)]
        return [sid for _, sid in keys]

    def page(self, user_id: str, want: Filter, position: Key | None, limit: int) -> Part:
        """Up to `limit` of the user's sessions in memory after `position`, newest first."""
        if want.live_only:
            return self._live_page(user_id, want, position, limit)
        keys = self._keys.get(user_id, [])
        i = len(keys) if position is None else bisect.bisect_left(keys, position)
        if want.created_before is not None:
            i = min(i, bisect.bisect_left(keys, (want.created_before, "")))
        rows, walked, key = [], 0, None
        while i > 0 and len(rows) < limit and walked < MAX_WALK:
            i -= 1
            key = keys[i]
            if want.below_window(key):
                return Part(rows, None)
            walked += 1
            s = self._held.get(key[1])
            if s is None or s.spec.user_id != user_id:
                self._forget(keys, i)
                continue
            if want.matches(s, key):
                rows.append(s)
        self.rows_read += walked
        return Part(rows, key if i > 0 else None)

    def _live_page(self, user_id: str, want: Filter, position: Key | None, limit: int) -> Part:
        """A filter of live states reads the user's live sessions only (a handful; the cap)."""
        live = sorted(((self._indexed[sid], s) for sid in self._live.get(user_id, ())
                       if (s := self._held.get(sid)) is not None), key=lambda ks: ks[0], reverse=True)
        self.rows_read += len(live)
        rows = [s for key, s in live if (position is None or key < position) and not want.below_window(key)
                and want.matches(s, key)]
        return Part(rows[:limit], session_key(rows[limit - 1]) if len(rows) > limit else None)

    def _still_held(self, key: Key) -> bool:
        if key[1] in self._held:
            return True
        self._indexed.pop(key[1], None)
        return False

    def _forget(self, keys: list[Key], i: int) -> None:
        self._indexed.pop(keys[i][1], None)
        del keys[i]

    def _drop_gone_oldest(self, keys: list[Key]) -> None:
        # Sessions leave memory roughly oldest first (ended past the retention period), so each
        # new key pays for dropping the gone ones at the old end; a page walk drops the others.
        gone = 0
        while gone < len(keys) and keys[gone][1] not in self._held:
            self._indexed.pop(keys[gone][1], None)
            gone += 1
        del keys[:gone]
