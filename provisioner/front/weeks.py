"""A user's quota week as the front gathers it: their quotas from the shared store and their
sessions from the clusters' lists and what the front remembers of the ended ones. The arithmetic
is provisioner/rules/quota.py's; the create's quota check (front/service.py with front/admission.py),
GetQuota and the budget sweep (front/budget_enforcer.py) all read a week through here."""

from __future__ import annotations

import asyncio
import logging

from provisioner.rules import quota
from provisioner.api import convert
from provisioner.config import FleetConfig
from provisioner.config.policy import QuotaConfig
from provisioner.front import admission
from provisioner.front.attempts import ATTEMPT_TIMEOUT_S
from provisioner.front.clusters import ClusterClient
from provisioner.front.ended_sessions import EndedSessions
from provisioner.front.listing import KIND_NAMES, LIVE_STATES, from_each, listed
from provisioner.front.records import FrontRecords, Made
from provisioner.model.records import request_key
from provisioner.store import Store
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import types_pb2 as pb

log = logging.getLogger(__name__)


def pool_gpus(config: FleetConfig) -> dict[tuple[str, str], float]:
    """Weighted GPUs per (cluster, pool): what one second of a session there meters."""
    q = config.settings.quotas
    return {(c.name, p.name): p.accelerator_count * q.weight(p.accelerator) for c in config.clusters for p in c.pools}


class Weeks:
    def __init__(self, config: FleetConfig, clients: dict[str, ClusterClient], store: Store, clock):
        """`clients`: the fleet's, by name; `clock`: the fleet's (model) time, as the budget's."""
        self.defaults = config.settings.quotas
        self.gpus = pool_gpus(config)
        self.clients, self.store, self.clock = clients, store, clock
        self.records = FrontRecords(store)
        self.ended_sessions = EndedSessions()  # so a check lists only what changed since the last
        self._noting: set[asyncio.Task] = set()

    async def quotas(self, user_id: str) -> QuotaConfig:
        """The fleet's quotas with what operators set for this user, read from the shared store on
        each call, so that every front replica applies a change at once."""
        return self.defaults.with_override((await self.store.read(self.store.operator.quota_override, user_id))[0])

    def week_start(self, q: QuotaConfig) -> float:
        """Sessions that ended before this meter nothing this week."""
        return quota.week_start(self.clock.now(), q)

    def row(self, s: pb.Session) -> quota.Row:
        """A listed session as metering counts it. A pool no longer in the config meters as one GPU
        of weight 1."""
        ready, end = s.ready_time.ToNanoseconds() / 1e9, s.end_time.ToNanoseconds() / 1e9
        metered = quota.Metered(gpus=self.gpus.get((s.cluster, s.pool), 1.0), ready_at=ready or None,
                                ended_at=end or None)
        return quota.Row(metered, KIND_NAMES.get(s.spec.kind, "interactive"), s.spec.request_id,
                         s.state in LIVE_STATES)

    def ended_row(self, s: pb.Session) -> tuple[str, float, quota.Row]:
        """(id, end, metering row) of an ended session."""
        return s.id, s.end_time.ToNanoseconds() / 1e9, self.row(s)

    def usage(self, sessions: list[pb.Session], ended: list[quota.Row], now: float, q: QuotaConfig) -> quota.Usage:
        """The user's week from the sessions listed (live, and those that ended since what `ended`,
        the rows remembered, holds)."""
        return quota.user_usage([*ended, *map(self.row, sessions)], now, q)

    async def week(self, user_id: str, q: QuotaConfig, lenient: bool = True, made: list[Made] | None = None,
                   answered: set[str] | None = None) -> tuple[list[pb.Session], list[quota.Row]]:
        """A user's sessions that meter this week: those each cluster lists (the live ones and those
        ended since the latest end this front has seen there, brief), and the rows of the ended
        ones it remembers (front/ended_sessions.py). `lenient`: a cluster that fails to answer in
        ATTEMPT_TIMEOUT_S is left out (and logged) instead of failing the call. The ends of the
        `made` sessions (the store's, front/admission.py) that the lists show are recorded.
        `answered` is given the names of the clusters that listed."""
        week_start = self.week_start(q)
        timeout = ATTEMPT_TIMEOUT_S if lenient else None
        seen = self.ended_sessions
        ended_made: list[tuple[str, float]] = []

        async def one(c: ClusterClient) -> list[pb.Session]:
            asked_after, asked_at = seen.ask_after(user_id, c.name, week_start), self.clock.now()
            out = await listed(c, cluster_pb.ListRequest(user_id=user_id, ended_after=convert.timestamp(asked_after),
                                                         brief=True), timeout)
            seen.add(user_id, c.name, [self.ended_row(s) for s in out if s.state not in LIVE_STATES], asked_at)
            if answered is not None:
                answered.add(c.name)
            if made:
                ended_made.extend(admission.ends_seen([m for m in made if m.cluster == c.name], out, asked_after))
            return [s for s in out if s.state in LIVE_STATES]

        sessions = await from_each([c for c in self.clients.values() if c.healthy], one, user_id, lenient)
        ended = [row for c in self.clients for row in seen.rows(user_id, c, week_start)]
        # A cluster no longer in the fleet is not listed, and its sessions are not counted.
        gone = [(m.session_id, self.clock.now()) for m in made or () if m.cluster not in self.clients]
        if ended_made or gone:
            self._note_ends(user_id, ended_made + gone, made)
        return sessions, ended

    def _note_ends(self, user_id: str, ended: list[tuple[str, float]], made: list[Made]) -> None:
        """Records the ends a check saw, in the background: the check that saw them has its answer."""
        by_session = {m.session_id: m.request_id for m in made}
        rows = [(request_key(user_id, by_session[sid]), sid, at) for sid, at in ended]
        task = asyncio.create_task(self.store.commit(self.records.mark_ended, rows))
        self._noting.add(task)
        task.add_done_callback(self._noted)

    def _noted(self, task: asyncio.Task) -> None:
        self._noting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # Only the store's bound stays looser: the next check that lists records them again.
            log.warning("could not record the sessions a quota check saw end: %s", task.exception())

    async def flush(self) -> None:
        """Waits for the ends being recorded (before the store closes)."""
        await asyncio.gather(*self._noting, return_exceptions=True)
