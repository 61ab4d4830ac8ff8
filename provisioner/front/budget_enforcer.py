"""The front's part in the weekly GPU budget of running sessions.

Only the front sees a user's sessions on every cluster, so it computes when a user's budget runs
out at the rate of their running sessions (`quota.exhaustion_time`, the same number GetQuota
shows) and tells the cluster of each running session (`ClusterService.SetBudgetEnd`) whenever
that moves: a session started or ended elsewhere, an operator's override, the weekly reset. The
cluster warns the session's watchers ahead of the end and stops it then (`decide/budgets.py`).
Every front replica sweeps; the call is idempotent, so they need no coordination, and a front
that dies leaves the others (or itself, restarted) to carry on at the next sweep.

A sweep lists each cluster once, for every user: the live sessions and those that ended since
its last sweep there. A user's end follows from their running sessions, the week's metered time
and their quotas, and does not move while none of these changes (the time metered grows at the
rate the end was computed for). So it is computed again only for the users whose running
sessions changed, who had a session end (one that started and ended between two sweeps metered
time too), whose quotas changed, or whose week turned over; the others cost nothing more. The
ends the lists show are carried into what the front remembers of each user's ended sessions
(front/ended_sessions.py), so a user's week is then known from the lists alone; a user the front
knows too little of is listed on their own, at every cluster.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from provisioner.rules import quota
from provisioner.api import convert
from provisioner.api.status import RemoteError
from provisioner.config.policy import QuotaConfig
from provisioner.model.errors import quote
from provisioner.front.attempts import ATTEMPT_TIMEOUT_S
from provisioner.front.clusters import ClusterClient
from provisioner.front.ended_sessions import CLOCK_MARGIN_S
from provisioner.front.retry import call
from provisioner.front.listing import LIVE_STATES, listed
from provisioner.front.weeks import Weeks
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import types_pb2 as pb

if TYPE_CHECKING:
    from provisioner.front.service import Fleet

log = logging.getLogger(__name__)

ENFORCE_EVERY_S = 60.0  # of model time, like the budget itself
TOLERANCE_S = 1.0  # an end this close to the one a session holds is not sent again
# A page of the list of every session is one message on the connection creates use: a smaller one
# holds them up less (5,000 sessions in one held every call for about 100 ms).
SWEEP_PAGE_SIZE = 500
# Wall seconds between two pages: converting a page takes the cluster a few milliseconds, and pages
# asked back to back held its calls for a tenth of a second at a time.
SWEEP_PAGE_PAUSE_S = 0.02
# Sessions of a list gone through between two turns of the event loop: a few thousand at once
# (sorted by user, their ends noted) held every create in flight for 16-28 ms at the end of a sweep.
SWEEP_SESSIONS_AT_ONCE = 250


@dataclass(frozen=True)
class _Basis:
    """What a user's budget end was last computed from: it stands while none of this changes."""

    running: frozenset[str]  # session ids
    quotas: QuotaConfig
    week_start: float


@dataclass
class _Lists:
    """What one sweep's lists of the clusters show, by user."""

    every_cluster: bool  # every healthy cluster answered
    asked_at: dict[str, float] = field(default_factory=dict)  # by cluster
    live: dict[str, list[pb.Session]] = field(default_factory=dict)
    running: dict[str, set[str]] = field(default_factory=dict)  # session ids
    ended: dict[str, set[str]] = field(default_factory=dict)  # session ids, of those ended since the last sweep


class BudgetEnforcer:
    def __init__(self, weeks: Weeks, fleet: Fleet):
        """`weeks`: the users' quota weeks, as the creates' checks read them (with the fleet's
        clock); `fleet`: the clusters."""
        self.weeks, self.fleet, self.clock = weeks, fleet, weeks.clock
        self._basis: dict[str, _Basis] = {}  # by user, of those running at the last sweep
        self._listed_at: dict[str, float] = {}  # by cluster: when its last sweep list was asked for
        self._ended: set[str] = set()  # the ended sessions the last sweep saw

    async def run(self) -> None:
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the GPU budget sweep failed; the next one retries")
            await self.clock.sleep(ENFORCE_EVERY_S)

    async def sweep(self) -> int:
        """Sends each running session whose budget end moved its new end; returns how many. And
        has the clusters told the blocked users again (front/blocks.py)."""
        if (pusher := self.fleet.block_pusher) is not None:
            pusher.soon()
        lists = await self._list_all()
        basis: dict[str, _Basis] = {}
        sent = 0
        for user in sorted(lists.running):
            await asyncio.sleep(0)  # a sweep of many users holds up no call for long (reads can be inline)
            q = await self.weeks.quotas(user)
            now_basis = _Basis(frozenset(lists.running[user]), q, self.weeks.week_start(q))
            if lists.ended.get(user, set()) - self._ended or self._basis.get(user) != now_basis:
                told, complete = await self._enforce(user, q, lists)
                sent += told
                if not complete:  # not remembered: the next sweep computes this user's end again
                    continue
            basis[user] = self._basis[user] = now_basis
        self._basis = basis
        # A list asks a little further back than the last one: an end it shows again is not new.
        self._ended = set().union(*lists.ended.values())
        return sent

    def _known_week(self, user: str, q: QuotaConfig, lists: _Lists) -> tuple[list[pb.Session], list] | None:
        """The user's week (as Weeks.week gives it) from this sweep's lists and the
        ended sessions remembered, if every cluster answered and every end the user had on each
        before its list is remembered; else None."""
        remembered = self.weeks.ended_sessions
        if not lists.every_cluster or any(remembered.covered(user, c) < at for c, at in lists.asked_at.items()):
            return None
        week_start = self.weeks.week_start(q)
        ended = [row for c in self.fleet.clients for row in remembered.rows(user, c, week_start)]
        return lists.live.get(user, []), ended

    async def _list_all(self) -> _Lists:
        """One list of each cluster. A cluster that does not answer is left out (its users'
        running sessions then look changed, and are looked at in full) and asked again from the
        same time at the next sweep."""
        clients = [c for c in self.fleet.clients.values() if c.healthy]
        results = await asyncio.gather(*(self._list(c) for c in clients), return_exceptions=True)
        lists = _Lists(every_cluster=True)
        for c, result in zip(clients, results):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                log.warning("cluster %s did not list its sessions for the GPU budget sweep: %s", c.name, result)
                lists.every_cluster = False
                continue
            sessions, lists.asked_at[c.name] = result
            for i, s in enumerate(sessions):
                if i and not i % SWEEP_SESSIONS_AT_ONCE:
                    await asyncio.sleep(0)
                user = s.spec.user_id
                if s.state in LIVE_STATES:
                    lists.live.setdefault(user, []).append(s)
                    if s.state == pb.SESSION_STATE_RUNNING:
                        lists.running.setdefault(user, set()).add(s.id)
                else:
                    lists.ended.setdefault(user, set()).add(s.id)
        return lists

    async def _list(self, c: ClusterClient) -> tuple[list[pb.Session], float]:
        """Every user's live sessions on `c`, and those ended since its last sweep list (less a
        margin for the clocks), brief; and when they were asked for. What they tell of ends is
        carried into the front's memory of each user's ended sessions."""
        asked_at, before = self.clock.now(), self._listed_at.get(c.name)
        since = (asked_at if before is None else before) - CLOCK_MARGIN_S
        out = await listed(c, cluster_pb.ListRequest(ended_after=convert.timestamp(since), brief=True),
                           ATTEMPT_TIMEOUT_S, SWEEP_PAGE_SIZE, SWEEP_PAGE_PAUSE_S)
        if before is not None:
            # Each ended session's row is made in the loop that yields: after a run of thousands,
            # making them all at once held the front's loop for 20-25 ms.
            ended_by_user: dict[str, list] = {}
            for i, s in enumerate(out):
                if i and not i % SWEEP_SESSIONS_AT_ONCE:
                    await asyncio.sleep(0)
                if s.state not in LIVE_STATES:
                    ended_by_user.setdefault(s.spec.user_id, []).append(self.weeks.ended_row(s))
            self.weeks.ended_sessions.extend(c.name, before, asked_at, ended_by_user)
        self._listed_at[c.name] = asked_at
        return out, asked_at

    async def _enforce(self, user: str, q: QuotaConfig, lists: _Lists) -> tuple[int, bool]:
        """Tells the user's running sessions their budget end; how many were told, and whether
        every one that needed it was. A cluster that cannot be reached is left for the next sweep:
        the sweep goes on with the user's other sessions and the other users."""
        sessions, ended = self._known_week(user, q, lists) or await self.weeks.week(user, q)
        now = self.clock.now()
        ends_at = quota.exhaustion_time(self.weeks.usage(sessions, ended, now, q), now) or 0.0
        sent, complete = 0, True
        for s in sessions:
            held = s.budget_end_time.ToNanoseconds() / 1e9 if s.HasField("budget_end_time") else 0.0
            if s.state != pb.SESSION_STATE_RUNNING or abs(held - ends_at) < TOLERANCE_S:
                continue
            request = cluster_pb.SetBudgetEndRequest(session_id=s.id)
            if ends_at:
                request.end_time.CopyFrom(convert.timestamp(ends_at))
            client = self.fleet.for_session(s.id)
            try:
                await call(client.sessions.SetBudgetEnd, request, ATTEMPT_TIMEOUT_S)
            except RemoteError as err:
                log.warning("cluster %s was not told the budget end of session %s; the next sweep tells it: %s",
                            client.name, quote(s.id), err.code.name)
                complete = False
                continue
            sent += 1
        return sent, complete
