"""The front's public services: SessionService for clients, AdminService for operators.

A new session goes to the best-ranked cluster; if that cluster refuses, the next one is tried
within the caller's deadline. Everything about an existing session goes straight to the cluster
its id names.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from contextlib import asynccontextmanager
from typing import AsyncIterator

import grpc
from opentelemetry import trace

from provisioner.observability import telemetry
from provisioner.api import convert, guard
from provisioner.api.status import RemoteError, stream, unary
from provisioner.common.pacing import Pacer
from provisioner.store.audit_log import AuditLog
from provisioner.config import FleetConfig
from provisioner.config.policy import QuotaConfig
from provisioner.model.errors import InvalidArgument, NotFound, QuotaExceeded, Unavailable, quote
from provisioner.front import admission, blocks, project_quota
from provisioner.front.admin import FRONT_ONLY_ADMIN_RPCS, FrontAdminServicer
from provisioner.front.blocks import Block
from provisioner.front.cluster_reports import checked
from provisioner.front.clusters import ClusterClient
from provisioner.front.listing import LIVE_STATES, list_page
from provisioner.front.placement import AdmissionChanged, Placement
from provisioner.front.rates import Rates
from provisioner.front.records import Made
from provisioner.front.retry import DEFAULT_DEADLINE_S, call
from provisioner.front.router import hint_note
from provisioner.front.weeks import Weeks
from provisioner.model.records import cluster_of
from provisioner.rules.quota import exhaustion_time
from provisioner.store import SqliteStore
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import session_service_pb2_grpc as session_grpc
from provisioner.v1 import types_pb2 as pb

__all__ = ["FRONT_ONLY_ADMIN_RPCS", "LIVE_STATES", "Fleet", "SessionServicer", "register"]

log = logging.getLogger(__name__)

# A create checks again when another replica recorded a create of the same user meanwhile; it
# gives up (retryably) after this many checks.
ADMISSION_TRIES = 20
MAX_USERS_LISTED = 10_000


class Fleet:
    """The clusters the front knows, by name."""

    def __init__(self, clients: list[ClusterClient]):
        self.clients = {c.name: c for c in clients}
        # By cluster: the quota checks that counted a user's sessions there from the front's
        # store, the cluster not listing them (front/admission.py, unlisted).
        self.counted_last_known: Counter[str] = Counter()
        self.block_pusher: blocks.Pusher | None = None  # tells the clusters the blocked users
        self.quota_relay: project_quota.Relay | None = None  # tells them the project's GPU quota

    def get(self, name: str, field: str = "cluster") -> ClusterClient:
        if name not in self.clients:
            raise NotFound(f"no cluster named {quote(name)}", field=field)
        return self.clients[name]

    def for_session(self, session_id: str) -> ClusterClient:
        name = cluster_of(session_id)
        if name not in self.clients:
            raise NotFound(f"session {quote(session_id)} not found (no cluster {quote(name)})", field="session_id")
        return self.clients[name]

    async def wait_until_ready(self, timeout_s: float) -> None:
        """Waits (wall time) for every cluster's first capacity report, or the timeout."""
        async def first(c: ClusterClient):
            await c.updated.wait()
        await asyncio.wait([asyncio.create_task(first(c)) for c in self.clients.values()], timeout=timeout_s)


def _remaining(context) -> float:
    left = context.time_remaining()
    return DEFAULT_DEADLINE_S if left is None else left


class SessionServicer(session_grpc.SessionServiceServicer):
    def __init__(self, config: FleetConfig, fleet: Fleet, store: SqliteStore, clock, wall):
        """`clock` is the fleet's (model) time; `wall` runs at wall speed, for network time."""
        self.config = config
        self.catalog = config.catalog  # replaced as the catalog feed refreshes (serve.py)
        self.fleet = fleet
        self.store = store
        self.clock = clock
        self.placement = Placement(fleet.clients, store, wall)
        self.records = self.placement.records
        self.limits = config.settings
        self.weeks = Weeks(config, fleet.clients, store, clock)  # users' quota weeks, for checks and GetQuota
        pools = {p.name: p.accelerator for c in config.clusters for p in c.pools}
        # The most one session can meter per second: what a check that knows only when a session
        # was made assumes it ran on.
        self.rules = admission.Rules(pools, frozenset(c.region for c in config.clusters),
                                     self.limits.sessions.max_runtime_limit_s, self.limits.priority,
                                     self.limits.regions.inter_region_penalty_s,
                                     max(self.weeks.gpus.values(), default=1.0))
        # Refusals of the rate and the guard's of bad credentials wait in one pacer (cli/serve.py).
        self.pacer = Pacer(self.limits.rate_limits.refusal_pause_s)
        self.rates = Rates(self.limits.rate_limits, wall.now, self.pacer)  # wall time: see front/rates.py
        self._live_when_listed: dict[str, int] = {}  # by user: live sessions the last listing showed
        self._user_locks: dict[str, asyncio.Lock] = {}
        self._user_waiters: dict[str, int] = {}
        self._streams: set = set()
        self._watches: dict[str, int] = {}  # open watches by the owner of the session watched
        self.draining = False

    @unary
    async def CreateSession(self, request, context):
        span, who = trace.get_current_span(), guard.current()
        await self.rates.create(admission.user_of(request.spec, who.owner), who.caller.identity)
        asked = admission.ask(request.spec, who.owner, request.spec.request_id or str(uuid.uuid4()), self.rules,
                              self.catalog)
        span.set_attributes({telemetry.ATTR_REQUEST_ID: asked.spec.request_id, telemetry.ATTR_USER: asked.user_id,
                             telemetry.ATTR_IMAGE: asked.image, telemetry.ATTR_POOL: asked.spec.accelerator})
        deadline = self.placement.clock.now() + _remaining(context)
        # A user's creates are checked and placed one at a time in this front (a lock). Across
        # replicas, a create's attempt is recorded only if no other create of the user was recorded
        # since its check read the user's admission version; else it checks again, now counting
        # that one (front/records.py: admission). So two creates cannot both pass the check for the
        # last slot, and no write is spent on taking turns.
        async with self._one_user(asked.user_id), self.placement.exclusive(asked.key):
            await self.placement.recorded(asked.user_id)
            for _ in range(ADMISSION_TRIES):
                try:
                    return await self._check_and_place(asked, deadline)
                except AdmissionChanged:
                    span.add_event("checked again", {"reason": "another create of the user was recorded"})
            raise Unavailable(f"creates of user {quote(asked.user_id)} keep arriving at other front replicas at "
                              "once; retry", retry_after_s=0.1)

    async def _check_and_place(self, asked: admission.Asked, deadline: float) -> session_pb.CreateSessionResponse:
        """One check of the create (front/admission.py decides; this gathers and carries out),
        then its placement; AdmissionChanged if another replica recorded a create of the user
        since the store was read."""
        span, user = trace.get_current_span(), asked.user_id
        q = await self.weeks.quotas(user)
        stored = await self.store.read(self.records.admission, asked.key, self.weeks.week_start(q), self.clock.now())
        check = admission.CreateCheck(asked, self.rules)
        action = check.handle(admission.Read(q, stored, None if stored.answer else Block.read(self.store, user),
                                             self._live_when_listed.get(user, 0), self.clock.now()))
        if isinstance(action, admission.ListWeek):
            span.add_event("quota: listing the clusters", {"reason": action.reason})
            action = check.handle(await self._list_week(asked, q))
        if isinstance(action, admission.Answer):
            span.add_event("duplicate request", {"session.id": action.session_id})
            resp = await call(self.fleet.for_session(action.session_id).sessions.Get,
                              cluster_pb.GetRequest(session_id=action.session_id))
            return session_pb.CreateSessionResponse(session=checked(cluster_of(action.session_id), resp.session))
        if isinstance(action, (admission.Refuse, admission.Rank)) and action.last_known:
            self._note_last_known(user, action.last_known)
        if isinstance(action, admission.Rank):
            if not action.listed:
                span.add_event("quota: within, from the store")
            views = [c.view() for c in self.fleet.clients.values()]
            now = self.clock.now()
            action = check.handle(admission.Viewed(views, project_quota.current(self.fleet.clients.values(), now),
                                                   now, getattr(self.clock, "time_scale", 1.0)))
        if isinstance(action, admission.Refuse):
            if isinstance(action.error, QuotaExceeded):
                span.add_event("quota refused", {"quota.subject": action.error.field})
            raise action.error
        for cand in action.candidates:
            span.add_event("candidate", {"cluster": cand.cluster, "expected_s": cand.expected_s, "how": cand.how,
                                         "region_penalty_s": cand.region_penalty_s, "load": cand.load})
        first = self.fleet.clients[action.candidates[0].cluster]
        hold = first.hold(asked.spec.accelerator, asked.image)
        try:
            session = await self.placement.place(asked.spec_pb, action.candidates, deadline, stored.version,
                                                 self.clock.now(), stored.sticky)
        finally:
            first.settle(hold)
        return session_pb.CreateSessionResponse(
            session=session, placement_note=hint_note(views, action.candidates, asked.spec.region_hint, session.cluster))

    async def _list_week(self, asked: admission.Asked, q: QuotaConfig) -> admission.Listed:
        """The user's week as the clusters list it, with the sessions the store knows made and not
        seen to end (this request's aside)."""
        user = asked.user_id
        made = [m for m in await self.store.read(self.records.made_not_seen_ended, user)
                if m.request_id != asked.spec.request_id]
        answered: set[str] = set()
        sessions, ended = await self.weeks.week(user, q, made=made, answered=answered)
        if len(self._live_when_listed) >= MAX_USERS_LISTED:
            self._live_when_listed.clear()  # a cache: forgotten users are listed a little sooner
        self._live_when_listed[user] = len(sessions)
        return admission.Listed([self.weeks.row(s) for s in sessions], ended, made, frozenset(answered))

    async def _check_reads(self, user_id: str) -> None:
        await self.rates.read(user_id, guard.current().caller.identity)

    @asynccontextmanager
    async def _one_user(self, user_id: str) -> AsyncIterator[None]:
        lock = self._user_locks.setdefault(user_id, asyncio.Lock())
        self._user_waiters[user_id] = self._user_waiters.get(user_id, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._user_waiters[user_id] -= 1
            if not self._user_waiters[user_id]:
                del self._user_waiters[user_id], self._user_locks[user_id]

    def _note_last_known(self, user_id: str, last_known: tuple[Made, ...]) -> None:
        by_cluster = Counter(m.cluster for m in last_known)
        self.fleet.counted_last_known.update(by_cluster.keys())
        log.warning("quota check of user %s: %s did not list; counting their sessions made there and not "
                    "seen to end as live", quote(user_id),
                    ", ".join(f"cluster {c} ({n} sessions)" for c, n in sorted(by_cluster.items())))

    async def flush(self) -> None:
        """Waits for the ends and the answers being recorded (before the store closes)."""
        await asyncio.gather(self.weeks.flush(), self.placement.flush(), return_exceptions=True)

    @unary
    async def GetSession(self, request, context):
        # The answer carries the session's secret: a user's Get finds only that user's sessions
        # (another's is NOT_FOUND), service and admin callers find every one.
        resp = await call(self.fleet.for_session(request.session_id).sessions.Get,
                          cluster_pb.GetRequest(session_id=request.session_id, user_id=guard.current().owner,
                                                with_access_token=True))
        return session_pb.GetSessionResponse(session=checked(cluster_of(request.session_id), resp.session))

    @unary
    async def ListSessions(self, request, context):
        user_id = request.user_id or guard.current().owner  # "" (every user's) only for service and admin
        await self._check_reads(user_id)
        if request.cluster and request.cluster not in self.fleet.clients:
            raise NotFound(f"no cluster {quote(request.cluster)}; clusters: {', '.join(sorted(self.fleet.clients))}")
        if request.cluster and not self.fleet.clients[request.cluster].healthy:
            raise Unavailable(f"cluster {request.cluster} is unreachable")
        return await list_page(self.fleet.clients, user_id, request)

    @stream
    async def WatchSession(self, request, context):
        client = self.fleet.for_session(request.session_id)
        call = client.sessions.Watch(cluster_pb.WatchRequest(
            session_id=request.session_id, after_revision=request.after_revision, user_id=guard.current().owner))
        self._streams.add(call)
        owner = ""
        try:
            async for resp in call:
                if not owner:  # the first answer names the session's owner
                    owner = self._count_watch(resp.session.spec.user_id)
                yield session_pb.WatchSessionResponse(session=checked(client.name, resp.session))
        except asyncio.CancelledError:
            if not self.draining:
                raise
        except grpc.aio.AioRpcError as err:
            raise RemoteError(err) from None
        finally:
            self._streams.discard(call)
            call.cancel()
            if owner and not (left := self._watches.get(owner, 1) - 1):
                self._watches.pop(owner, None)
            elif owner:
                self._watches[owner] = left

    def _count_watch(self, owner: str) -> str:
        """Counts an open watch against the session's owner, whoever opened it (a service watching
        for its users included): a user's sessions are watched by at most the user's stream cap
        at a time on this front."""
        cap = self.limits.security.max_streams.get("user")
        if cap is not None and self._watches.get(owner, 0) >= cap:
            raise QuotaExceeded(f"at most {cap} open watches of user {quote(owner)}'s sessions at a time",
                                retry_after_s=5.0)
        self._watches[owner] = self._watches.get(owner, 0) + 1
        return owner

    def end_streams(self) -> None:
        """Draining: ends open watches (clients resume with after_revision) so shutdown need not
        wait for them."""
        self.draining = True
        for stream_call in list(self._streams):
            stream_call.cancel()

    @unary
    async def TouchSession(self, request, context):
        resp = await call(self.fleet.for_session(request.session_id).sessions.Touch,
                          cluster_pb.TouchRequest(session_id=request.session_id, user_id=guard.current().owner))
        return session_pb.TouchSessionResponse(session=checked(cluster_of(request.session_id), resp.session))

    @unary
    async def StopSession(self, request, context):
        resp = await call(self.fleet.for_session(request.session_id).sessions.Stop,
                          cluster_pb.StopRequest(session_id=request.session_id, reason=request.reason,
                                                 user_id=guard.current().owner))
        return session_pb.StopSessionResponse(session=checked(cluster_of(request.session_id), resp.session))

    @unary
    async def GetQuota(self, request, context):
        user_id = request.user_id or guard.current().owner
        if not user_id:
            raise InvalidArgument("user_id must not be empty", field="user_id")
        await self._check_reads(user_id)
        return session_pb.GetQuotaResponse(quota=await self.quota(user_id))

    async def quota(self, user_id: str) -> pb.Quota:
        """The user's limits in force (overrides applied) and this week's usage."""
        q = await self.weeks.quotas(user_id)
        sessions, ended = await self.weeks.week(user_id, q, lenient=False)
        now = self.clock.now()
        u = self.weeks.usage(sessions, ended, now, q)
        out = pb.Quota(
            user_id=user_id, gpu_hours_limit=q.gpu_hours_per_week, gpu_hours_used=u.used_s / 3600,
            gpu_hours_left=u.left_s / 3600, reset_time=convert.timestamp(u.reset_time),
            max_active_sessions=q.max_active("interactive"), active_sessions=u.active.get("interactive", 0),
            max_active_batch_sessions=q.max_active("batch"), active_batch_sessions=u.active.get("batch", 0))
        if (runs_out := exhaustion_time(u, now)) is not None:
            out.exhaustion_time.CopyFrom(convert.timestamp(runs_out))
        return out


SERVICE_NAMES = (
    session_pb.DESCRIPTOR.services_by_name["SessionService"].full_name,
    admin_pb.DESCRIPTOR.services_by_name["AdminService"].full_name,
)


def register(server, servicer: SessionServicer):
    session_grpc.add_SessionServiceServicer_to_server(servicer, server)
    audit = AuditLog(servicer.store, servicer.clock)
    admin_grpc.add_AdminServiceServicer_to_server(FrontAdminServicer(servicer.fleet, audit, servicer), server)
    return SERVICE_NAMES
