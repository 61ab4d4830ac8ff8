"""The pools' queues of sessions waiting for a VM: who is in each, in which order, at which place,
and when each times out. Pure.

Part of the session side: decide/sessions.py alone holds one and asks it to take sessions in and out;
the order is decide/assignment.py's QueueOrder, kept between changes.
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterator, Mapping

from provisioner.decide.changes import Changes
from provisioner.decide.pools import PoolState
from provisioner.model.errors import quote
from provisioner.model.records import Session
from provisioner.model.states import SessionState as S


def why_waiting(pool: PoolState, s: Session, at_ceiling: bool) -> str:
    """Why a session its pool could not place waits (`at_ceiling`: its user holds the pool's
    per-user ceiling)."""
    if at_ceiling:
        return (f"waiting for one of its user's sessions to end: user {quote(s.spec.user_id)} holds the "
                f"pool's per-user ceiling of {pool.policy.max_vms_per_user} VMs")
    if pool.total >= pool.policy.max_vms:
        return f"waiting for capacity: the pool is at its maximum of {pool.policy.max_vms} VMs"
    return "waiting for capacity: every zone of the pool is stocked out"


class Queue:
    def __init__(self, pools: Mapping[str, PoolState], sessions: Mapping[str, Session], timeout_s: float,
                 ranks: Mapping[str, int], holding: Callable[[str], Mapping[str, int]],
                 first: Callable[[str], frozenset[str]], changes: Changes):
        self._pools, self._sessions = pools, sessions  # the pools' queues are written here only
        self._timeout_s = timeout_s  # sessions.queue_timeout_s (0: none)
        self._ranks = ranks  # the priority classes' ranks, the queue's first key
        self._holding = holding  # pool -> user -> the VMs the user's sessions hold there
        self._first = first  # pool -> the queued sessions that preempted others: first in line
        self._changes = changes
        self._due: list[tuple[float, str]] = []  # (time, session id) when a queued session times out

    def add(self, s: Session, now: float) -> None:
        """Takes `s`, just queued, in at its place."""
        pool = self._pools[s.pool]
        pool.queue[s.id] = None
        name = pool.config.name
        pool.order.add(s, self._holding(name), self._ranks, self._first(name))
        self.renumber(pool)
        self.watch(s, now)

    def restore(self, s: Session) -> None:
        """Takes `s`, queued before a restart, back in (its place is found at the next read)."""
        pool = self._pools[s.pool]
        pool.queue[s.id] = None
        pool.order.stale()
        self.watch(s, s.history[-1].time)

    def remove(self, s: Session) -> None:
        pool = self._pools[s.pool]
        del pool.queue[s.id]
        pool.order.remove(s, self._first(pool.config.name))

    def watch(self, s: Session, since: float) -> None:
        if self._timeout_s:
            heapq.heappush(self._due, (since + self._timeout_s, s.id))

    def due(self, now: float) -> bool:
        heap, sessions = self._due, self._sessions
        while heap and ((s := sessions.get(heap[0][1])) is None or s.state is not S.QUEUED):
            heapq.heappop(heap)  # no longer queued: if queued again, a later entry stands for it
        return bool(heap) and heap[0][0] <= now

    def expired(self, now: float) -> Iterator[Session]:
        """Takes out, one at a time, the sessions queued longer than the queue allows; the caller
        ends each before the next is looked at. The queues they left are numbered again once
        each, not once per session: a burst times out together."""
        heap, timeout = self._due, self._timeout_s
        left: dict[str, PoolState] = {}
        while heap and heap[0][0] <= now:
            _, sid = heapq.heappop(heap)
            s = self._sessions.get(sid)
            # Queued again since this entry was made: a later entry stands for it.
            if s is None or s.state is not S.QUEUED or s.history[-1].time + timeout > now:
                continue
            self.remove(s)
            yield s
            left[s.pool] = self._pools[s.pool]
        for pool in left.values():
            self.renumber(pool)

    def order(self, pool: PoolState) -> list[Session]:
        name = pool.config.name
        return pool.order.order(lambda: [self._sessions[i] for i in pool.queue], self._holding(name), self._ranks,
                                self._first(name))

    def renumber(self, pool: PoolState) -> None:
        """Sets the positions of the queue's sessions from the first that moved since the last
        renumbering on (those before kept theirs). A place is a live value, not part of the
        session's record: a move alone makes no new revision and nothing to write (one session
        leaving the head of a long queue would otherwise rewrite every other), only a report to
        the session's watchers."""
        order = self.order(pool)
        for pos in range(pool.order.take_changed(), len(order)):
            s = order[pos]
            if s.queue_position != pos + 1:
                s.queue_position = pos + 1
                self._changes.moved(s)

    def renumber_all(self) -> None:
        """After a restore: places are not written as they move, so every queue is numbered again."""
        for pool in self._pools.values():
            if pool.queue:
                self.renumber(pool)
