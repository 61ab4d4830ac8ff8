"""The front's part in the weekly GPU budget of running sessions.

Only the front sees a user's sessions on every cluster, so it computes when a user's budget runs
out at the rate of their running sessions (`quota.exhaustion_time`, the same number GetQuota
shows) and tells the cluster of each running session (`ClusterService.SetBudgetEnd`) whenever
that moves: a session started or ended elsewhere, an operator's override, the weekly reset. The
cluster warns the session's watchers ahead of the end and stops it then (`decide/budgets.py`).
Every front replica sweeps; the call is idempotent, so they need no coordination, and a front
that dies leaves the others (or itself, restarted) to carry on at the next sweep.
"""

from __future__ import annotations

import asyncio
import logging

from provisioner import quota
from provisioner.api import convert
from provisioner.front.retry import call
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import types_pb2 as pb

log = logging.getLogger(__name__)

ENFORCE_EVERY_S = 60.0  # of model time, like the budget itself
TOLERANCE_S = 1.0  # an end this close to the one a session holds is not sent again


class BudgetEnforcer:
    def __init__(self, sessions):
        """`sessions`: the front's SessionServicer (its clusters, clock, quotas and metering)."""
        self.svc = sessions

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
        running = await self.svc._user_sessions("", [pb.SESSION_STATE_RUNNING], lenient=True, brief=True)
        sent = 0
        for user in sorted({s.spec.user_id for s in running}):
            sent += await self._enforce(user)
        return sent

    async def _enforce(self, user: str) -> int:
        q = await self.svc.quotas(user)
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
