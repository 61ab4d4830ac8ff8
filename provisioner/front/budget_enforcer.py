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
rate the end was computed for). So only the users whose running sessions changed, who had a
session end (one that started and ended between two sweeps metered time too), whose quotas
changed, or whose week turned over are looked at in full, each at every cluster; the others
cost nothing more.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from provisioner import quota
from provisioner.api import convert
from provisioner.config_policy import QuotaConfig
from provisioner.front.clusters import ClusterClient
from provisioner.front.ended_sessions import CLOCK_MARGIN_S
from provisioner.front.attempts import ATTEMPT_TIMEOUT_S
from provisioner.front.retry import call
from provisioner.front.service import LIVE_STATES, listed
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import types_pb2 as pb

log = logging.getLogger(__name__)

ENFORCE_EVERY_S = 60.0  # of model time, like the budget itself
TOLERANCE_S = 1.0  # an end this close to the one a session holds is not sent again


@dataclass(frozen=True)
class _Basis:
    """What a user's budget end was last computed from: it stands while none of this changes."""

    running: frozenset[str]  # session ids
    quotas: QuotaConfig
    week_start: float


class BudgetEnforcer:
    def __init__(self, sessions):
        """`sessions`: the front's SessionServicer (its clusters, clock, quotas and metering)."""
        self.svc = sessions
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
            await self.svc.clock.sleep(ENFORCE_EVERY_S)

    async def sweep(self) -> int:
        """Sends each running session whose budget end moved its new end; returns how many."""
        running, ended = await self._changes()
        basis: dict[str, _Basis] = {}
        sent = 0
        for user in sorted(running):
            q = await self.svc.quotas(user)
            now_basis = _Basis(frozenset(running[user]), q, self.svc._week_start(q))
            if ended.get(user, set()) - self._ended or self._basis.get(user) != now_basis:
                sent += await self._enforce(user, q)
            basis[user] = self._basis[user] = now_basis
        self._basis = basis
        # A list asks a little further back than the last one: an end it shows again is not new.
        self._ended = set().union(*ended.values())
        return sent

    async def _changes(self) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        """The running sessions of each user and the sessions of each that ended since the last
        sweep (ids), from one list of each cluster. A cluster that does not answer is left out
        (its users' running sessions then look changed, and are looked at in full) and asked
        again from the same time at the next sweep."""
        clients = [c for c in self.svc.fleet.clients.values() if c.healthy]
        results = await asyncio.gather(*(self._list(c) for c in clients), return_exceptions=True)
        running: dict[str, set[str]] = {}
        ended: dict[str, set[str]] = {}
        for c, result in zip(clients, results):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                log.warning("cluster %s did not list its sessions for the GPU budget sweep: %s", c.name, result)
                continue
            for s in result:
                if s.state == pb.SESSION_STATE_RUNNING:
                    running.setdefault(s.spec.user_id, set()).add(s.id)
                elif s.state not in LIVE_STATES:
                    ended.setdefault(s.spec.user_id, set()).add(s.id)
        return running, ended

    async def _list(self, c: ClusterClient) -> list[pb.Session]:
        """Every user's live sessions on `c`, and those ended since its last sweep list (less a
        margin for the clocks), brief."""
        asked_at = self.svc.clock.now()
        since = self._listed_at.get(c.name, asked_at) - CLOCK_MARGIN_S
        request = cluster_pb.ListRequest(ended_after=convert.timestamp(since), brief=True)
        out = await listed(c, request, ATTEMPT_TIMEOUT_S)
        self._listed_at[c.name] = asked_at
        return out

    async def _enforce(self, user: str, q: QuotaConfig) -> int:
        sessions, ended = await self.svc._week(user, q)
        now = self.svc.clock.now()
        ends_at = quota.exhaustion_time(self.svc._usage(sessions, ended, now, q), now) or 0.0
        sent = 0
        for s in sessions:
            held = s.budget_end_time.ToNanoseconds() / 1e9 if s.HasField("budget_end_time") else 0.0
            if s.state != pb.SESSION_STATE_RUNNING or abs(held - ends_at) < TOLERANCE_S:
                continue
            request = cluster_pb.SetBudgetEndRequest(session_id=s.id)
            if ends_at:
                request.end_time.CopyFrom(convert.timestamp(ends_at))
            client = self.svc.fleet.for_session(s.id)
            await call(client.sessions.SetBudgetEnd, request)
            sent += 1
        return sent
