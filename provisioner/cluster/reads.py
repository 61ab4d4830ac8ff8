"""The cluster's read side, for its gRPC services: sessions, VMs and pools from the core's read
methods, and sessions that ended longer ago than sessions.retention_s (no longer in memory) from
the store. It writes nothing and starts nothing."""

from __future__ import annotations

from typing import Iterable

from provisioner.common.clock import Clock
from provisioner.decide.core import ClusterCore
from provisioner.decide.pools import PoolState
from provisioner.model.records import Session, Vm
from provisioner.store import Store


class ClusterReads:
    def __init__(self, core: ClusterCore, clock: Clock, store: Store | None):
        self.core = core
        self._clock = clock
        self._store = store
        # user -> ids of their sessions, so a user's List (every create's quota check) reads theirs
        # only, not every session in memory; ids of sessions that left memory are pruned on read.
        self._by_user: dict[str, set[str]] = {}

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
        ids = self._by_user.get(user_id, set())
        # Pruned by walking the user's ids, not every session in memory (set.intersection_update
        # with a dict walks the dict: 8.5% of the cluster's samples under creates, growing with
        # the sessions that ended within the retention period).
        ids.difference_update([sid for sid in ids if sid not in self.core.sessions])
        if not ids:
            self._by_user.pop(user_id, None)
        return self._with_older({sid: self.core.sessions[sid] for sid in ids}, user_id, ended_after)

    def _with_older(self, held: dict[str, Session], user_id: str, ended_after: float | None) -> list[Session]:
        # Memory holds every live session and every one that ended within the retention period
        # (restored at start, forgotten only once past it): the store is read for older ones only.
        retention = self.core.sessions_config.retention_s
        cutoff = self._clock.now() - retention
        if not retention or (ended_after is not None and ended_after > cutoff):
            return list(held.values())
        older = self._store.sessions.load_user_ended_sessions(self.core.name, user_id, ended_after, cutoff)
        return [*held.values(), *(s for s in older if s.id not in held)]

    def index_users(self, sessions: Iterable[Session]) -> None:
        """Notes whose sessions these are (after every step, and the sessions restored)."""
        for session in sessions:
            self._by_user.setdefault(session.spec.user_id, set()).add(session.id)

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
