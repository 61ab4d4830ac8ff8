"""The cluster's read side, for its gRPC services: sessions, VMs and pools from the core's read
methods, and sessions that ended longer ago than sessions.retention_s (no longer in memory) from
the store. It writes nothing and starts nothing."""

from __future__ import annotations

from provisioner.api.keyset import Key, Part, merge
from provisioner.cluster.listing import Filter, SessionIndex, session_key
from provisioner.common.clock import Clock
from provisioner.decide.core import ClusterCore
from provisioner.decide.pools import PoolState
from provisioner.model.records import Session, Vm, created_ns
from provisioner.store import Store


class ClusterReads:
    def __init__(self, core: ClusterCore, clock: Clock, store: Store | None):
        self.core = core
        self._clock = clock
        self._store = store
        # Each user's sessions in memory in list order, so a user's List (every create's quota
        # check, a page of ListSessions) reads theirs only, not every session in memory. Told of
        # the sessions of every step, and of those restored (cluster/runtime.py).
        self.index = SessionIndex(core.sessions)

    @property
    def name(self) -> str:
        return self.core.name

    @property
    def region(self) -> str:
        return self.core.config.region

    @property
    def draining(self) -> bool:
        return self.core.draining

    @property
    def catalog(self):
        return self.core.catalog

    def get(self, session_id: str, user_id: str = "") -> Session:
        return self.stored(session_id, user_id) or self.core.get(session_id, user_id)

    def get_by_request(self, key: str) -> Session:
        return self.stored_for_request(key) or self.core.get_by_request(key)

    def knows_request(self, key: str) -> bool:
        return key in self.core.by_request or self.stored_for_request(key) is not None

    def sessions(self, user_id: str = "", ended_after: float | None = None) -> list[Session]:
        """The sessions in memory and those ended long ago (since `ended_after`), of a user or, for
        "", of every user (an operator's list; with `ended_after`, as the budget enforcer asks,
        memory only: it asks after recent ends)."""
        if self._store is None or (not user_id and ended_after is not None):
            return list(self.core.sessions.values())
        if not user_id:
            return self._with_older(dict(self.core.sessions), "", None)
        ids = self.index.user_ids(user_id)
        return self._with_older({sid: self.core.sessions[sid] for sid in ids}, user_id, ended_after)

    def list_page(self, user_id: str, want: Filter, position: Key | None,
                  limit: int) -> tuple[list[Session], Key | None]:
        """A page of the user's sessions after `position`, newest first, and the position of the
        next (None: the last page): from memory, and from the store for those that ended before
        the retention period (each source read from the position for a page at most)."""
        parts = [held := self.index.page(user_id, want, position, limit)]
        retention = self.core.sessions_config.retention_s
        if self._store is not None and retention and not want.live_only:
            cutoff = created_ns(self._clock.now() - retention)  # an older ended one was made before it
            end = cutoff if want.created_before is None else min(cutoff, want.created_before)
            if held.more_after is not None and held.more_after >= (end, ""):
                return held.rows, held.more_after  # the store's sessions all come after this page
            older = self._store.sessions.user_sessions_page(self.core.name, user_id, position, want.created_after,
                                                            end, limit)
            more = session_key(older[-1]) if len(older) == limit else None
            self.index.rows_read += len(older)
            parts.append(Part([s for s in older if s.id not in self.core.sessions and want.matches(s, session_key(s))],
                              more))
        rows, positions = merge(parts, session_key, limit)
        going_on = [p for p in positions if p is not None]
        return rows, (max(going_on) if going_on else None)

    def _with_older(self, held: dict[str, Session], user_id: str, ended_after: float | None) -> list[Session]:
        # Memory holds every live session and every one that ended within the retention period
        # (restored at start, forgotten only once past it): the store is read for older ones only.
        retention = self.core.sessions_config.retention_s
        cutoff = self._clock.now() - retention
        if not retention or (ended_after is not None and ended_after > cutoff):
            return list(held.values())
        older = self._store.sessions.load_user_ended_sessions(self.core.name, user_id, ended_after, cutoff)
        return [*held.values(), *(s for s in older if s.id not in held)]

    def stored(self, session_id: str, user_id: str = "") -> Session | None:
        """A session no longer in memory, from the store (None if it is in memory, or nowhere)."""
        if session_id in self.core.sessions or self._store is None:
            return None
        s = self._store.sessions.load_session(self.core.name, session_id)
        return s if s is not None and (not user_id or s.spec.user_id == user_id) else None

    def stored_for_request(self, key: str) -> Session | None:
        """The session made for a request no longer in memory, from the store."""
        if key in self.core.by_request or self._store is None:
            return None
        return self._store.sessions.load_session_by_request(self.core.name, key)

    def pools(self) -> list[PoolState]:
        return list(self.core.pools.values())

    def pool(self, name: str) -> PoolState:
        return self.core.pool(name)

    def snapshot(self, pool: PoolState):
        return self.core.snapshot(pool)

    def cold_start_s(self) -> float:
        return self.core.cold_start_s()

    def vms(self) -> list[Vm]:
        return list(self.core.vms.values())
