"""The watchers' hub: each Watch stream of one session, told of its session's changes and moves in
the queue, and what the capacity streams wait on (a notice of the next change) and send (the
sessions the abuse watch flagged). It is told only of durable steps (cluster/runtime.py)."""

from __future__ import annotations

import asyncio
import math
from typing import AsyncIterator, Iterable

from provisioner.cluster.reads import ClusterReads
from provisioner.decide.commands import Step
from provisioner.model.errors import Unavailable
from provisioner.model.records import Session
from provisioner.model.states import SessionState

MOVE_REPORT_S = 2.0  # wall time between two reports to a watcher of its session moving up the queue


class Watchers:
    def __init__(self, reads: ClusterReads, move_report_s: float = MOVE_REPORT_S):
        self._reads = reads
        self.move_report_s = move_report_s  # least wall time between two reports of a watch's moves
        self._watchers: dict[str, set[_Watch]] = {}
        # Replaced on every notice, so each capacity stream sees every change (none clears it for others).
        self._capacity_changed = asyncio.Event()
        # Flagged sessions in memory (provisioner/decide/abuse_watch.py), each with the number it was
        # noted as, in order, so a capacity stream sends each once, and once durable.
        self._flags: dict[str, tuple[int, Session]] = {}
        self._flags_noted = 0
        # Set when draining: open streams end instead of holding the shutdown.
        self.streams_closed = False

    def tell(self, step: Step) -> None:
        """Tells the watchers of a durable step's changes and moves, and the capacity streams."""
        for s in step.sessions:
            for w in self._watchers.get(s.id, ()):
                w.changed(s)
        for s in step.moved:
            for w in self._watchers.get(s.id, ()):
                w.moved(s)
        self.note_flags(step.sessions)
        if step.sessions or step.vms:  # a new flag is a changed session: the streams send it at once
            self.notify_capacity()

    def end_streams(self) -> None:
        """Ends every Watch and WatchCapacity stream (their clients resume where they were)."""
        self.streams_closed = True
        for watches in self._watchers.values():
            for w in watches:
                w.end()
        self.notify_capacity()

    async def watch(self, session_id: str, after_revision: int = 0, user_id: str = "") -> AsyncIterator[Session]:
        """The session now (if newer than after_revision, or queued: its place may have moved),
        then each change, and its moves in the queue (at most one report per `move_report_s`, of
        the latest place), until it ends."""
        current = self._reads.get(session_id, user_id)
        if self.streams_closed:
            raise Unavailable("the cluster is shutting down")
        watch = _Watch(asyncio.get_running_loop(), self.move_report_s)
        self._watchers.setdefault(session_id, set()).add(watch)
        try:
            place = None  # the queue position last told
            if current.revision > after_revision or current.state is SessionState.QUEUED:
                after_revision, place = current.revision, current.queue_position
                yield current
            if current.terminal:
                return
            while (s := await watch.reports.get()) is not None:
                if s.revision > after_revision or (s.revision == after_revision and s.queue_position != place):
                    after_revision, place = s.revision, s.queue_position
                    yield s
                if s.terminal:
                    return
        finally:
            watch.end()
            self._watchers[session_id].discard(watch)
            if not self._watchers[session_id]:
                del self._watchers[session_id]

    def flagged(self, after: int = 0) -> tuple[int, list[Session]]:
        """The flagged sessions in memory noted after number `after`, and the last number noted."""
        for gone in [sid for sid in self._flags if sid not in self._reads.core.sessions]:
            del self._flags[gone]
        return self._flags_noted, [s for n, s in self._flags.values() if n > after]

    def note_flags(self, sessions: Iterable[Session]) -> None:
        """Numbers the newly flagged of `sessions` (restored ones at start, then each durable step's)."""
        for s in sessions:
            if s.abuse is not None and s.id not in self._flags:
                self._flags_noted += 1
                self._flags[s.id] = (self._flags_noted, s)

    def capacity_notice(self) -> asyncio.Event:
        """Set at the next change of capacity (or when the streams end): taken before a push, so
        a change made while a stream waits out its interval is not missed."""
        return self._capacity_changed

    def notify_capacity(self) -> None:
        self._capacity_changed.set()
        self._capacity_changed = asyncio.Event()


class _Watch:
    """One watch's reports: each change of its session, in order, and its moves in the queue at
    most one report per `interval_s`, of the latest place. In a long queue every departure from
    its head moves every session behind it: a report per move to every watcher would cost the
    cluster, the front and each client more than the moves cost the core."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float):
        self.reports: asyncio.Queue[Session | None] = asyncio.Queue()
        self._loop, self._interval_s = loop, interval_s
        self._move_told_at = -math.inf  # the loop's time of the last move reported
        self._held: Session | None = None  # moved since then: reported when the interval is over
        self._timer: asyncio.TimerHandle | None = None

    def changed(self, s: Session) -> None:
        self._drop_held()  # the change's report carries the place too
        self.reports.put_nowait(s)

    def moved(self, s: Session) -> None:
        now = self._loop.time()  # wall time on purpose: the pace is what the cluster, the front and clients bear
        if self._timer is not None:
            self._held = s
        elif now - self._move_told_at >= self._interval_s:
            self._tell_move(s)
        else:
            self._held = s
            self._timer = self._loop.call_at(self._move_told_at + self._interval_s, self._release)

    def end(self) -> None:
        self._drop_held()
        self.reports.put_nowait(None)

    def _release(self) -> None:
        self._timer = None
        held, self._held = self._held, None
        if held is not None:
            self._tell_move(held)  # as it stands now: the latest place

    def _tell_move(self, s: Session) -> None:
        self._move_told_at = self._loop.time()
        self.reports.put_nowait(s)

    def _drop_held(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held = None

