"""The front's public services: SessionService for clients, AdminService for operators.

A new session goes to the best-ranked cluster; if that cluster refuses, the next one is tried
within the caller's deadline. Everything about an existing session goes straight to the cluster
its id names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections import Counter
from contextlib import asynccontextmanager
from typing import AsyncIterator

import grpc
from opentelemetry import trace

from provisioner import quota, ratelimit, telemetry
from provisioner.api import convert, guard
from provisioner.api.paging import MAX_BRIEF_PAGE_SIZE, MAX_PAGE_SIZE, audit_page, page
from provisioner.api.status import RemoteError, stream, unary
from provisioner.audit import AuditLog
from provisioner.config import FleetConfig
from provisioner.config_policy import QuotaConfig
from provisioner.errors import InvalidArgument, NotFound, QuotaExceeded, RateLimited, Unavailable, quote
from provisioner.front import admission, blocks
from provisioner.front.cluster_reports import checked
from provisioner.front.block_admin import BLOCK_RPCS, BlockAdmin
from provisioner.front.clusters import ClusterClient
from provisioner.front.ended_sessions import EndedRow, EndedSessions
from provisioner.front.placement import ATTEMPT_TIMEOUT_S, AdmissionChanged, Placement
from provisioner.front.records import Admission, Made
from provisioner.front.retry import DEFAULT_DEADLINE_S, call
from provisioner.front.router import hint_note, rank, why_none
from provisioner.model import cluster_of, request_key
from provisioner.store import SqliteStore
from provisioner.validation import pool_named, priority_class, validate_spec
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import session_service_pb2_grpc as session_grpc
from provisioner.v1 import types_pb2 as pb

log = logging.getLogger(__name__)

STATUS_TIMEOUT_S = 1.0
# A create checks again when another replica recorded a create of the same user meanwhile; it
# gives up (retryably) after this many checks.
ADMISSION_TRIES = 20
MAX_USERS_LISTED = 10_000
LIVE_STATES = [pb.SESSION_STATE_QUEUED, pb.SESSION_STATE_PROVISIONING, pb.SESSION_STATE_PULLING_IMAGE,
               pb.SESSION_STATE_STARTING, pb.SESSION_STATE_RUNNING, pb.SESSION_STATE_STOPPING]
KIND_NAMES = {pb.SESSION_KIND_UNSPECIFIED: "interactive", pb.SESSION_KIND_INTERACTIVE: "interactive",
              pb.SESSION_KIND_BATCH: "batch"}


class Fleet:
    """The clusters the front knows, by name."""

    def __init__(self, clients: list[ClusterClient]):
        self.clients = {c.name: c for c in clients}
        # By cluster: the quota checks that counted a user's sessions there from the front's
        # store, the cluster not listing them (front/admission.py, unlisted).
        self.counted_last_known: Counter[str] = Counter()
        self.block_pusher: blocks.Pusher | None = None  # tells the clusters the blocked users

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
        self.pools = {p.name for c in config.clusters for p in c.pools}
        self.pool_accelerators = {p.name: p.accelerator for c in config.clusters for p in c.pools}
        self.regions = {c.region for c in config.clusters}
        self.limits = config.settings
        q = self.limits.quotas
        self.ended_sessions = EndedSessions()  # so a quota check lists only what changed since the last
        # Weighted GPUs per (cluster, pool): what one second of a session there meters.
        self.gpus = {(c.name, p.name): p.accelerator_count * q.weight(p.accelerator)
                     for c in config.clusters for p in c.pools}
        # The most one session can meter per second: what a check that knows only when a session
        # was made assumes it ran on.
        self.max_gpus = max(self.gpus.values(), default=1.0)
        self._noting: set[asyncio.Task] = set()
        self._live_when_listed: dict[str, int] = {}  # by user: live sessions the last listing showed
        r = self.limits.rate_limits
        self.user_rates = ratelimit.TokenBuckets(r.creates_per_user_per_s, r.create_burst_per_user)
        self.caller_rates = ratelimit.TokenBuckets(r.creates_per_caller_per_s, r.create_burst_per_caller)
        self.user_reads = ratelimit.TokenBuckets(r.reads_per_user_per_s, r.read_burst_per_user)
        self.caller_reads = ratelimit.TokenBuckets(r.reads_per_caller_per_s, r.read_burst_per_caller)
        # Wall time, like a deadline: the retry delay a refusal gives is for clients to wait out.
        self.rate_clock = wall.now
        self._user_locks: dict[str, asyncio.Lock] = {}
        self._user_waiters: dict[str, int] = {}
        self._streams: set = set()
        self._watches: dict[str, int] = {}  # open watches by the owner of the session watched
        self.draining = False

    @unary
    async def CreateSession(self, request, context):
        span = trace.get_current_span()
        if not request.spec.request_id:
            request.spec.request_id = str(uuid.uuid4())
        if owner := guard.current().owner:  # a user creates sessions for itself only
            request.spec.user_id = owner
        self._check_rate(request.spec.user_id, guard.current().caller.identity)
        request.spec.accelerator = pool_named(request.spec.accelerator, self.pool_accelerators)
        spec = convert.spec_from_pb(request.spec)
        image = validate_spec(spec, self.pools, self.catalog, self.limits.sessions.max_runtime_limit_s)
        priority_class(spec, self.limits.priority)
        if spec.region_hint and spec.region_hint not in self.regions:
            raise InvalidArgument(f"unknown region {quote(spec.region_hint)}; the fleet's regions: "
                                  f"{', '.join(sorted(self.regions))}", field="spec.region_hint")
        span.set_attributes({telemetry.ATTR_REQUEST_ID: spec.request_id, telemetry.ATTR_USER: spec.user_id,
                             telemetry.ATTR_IMAGE: image, telemetry.ATTR_POOL: spec.accelerator})
        deadline = self.placement.clock.now() + _remaining(context)
        kind = KIND_NAMES[request.spec.kind]
        # A user's creates are checked and placed one at a time in this front (a lock). Across
        # replicas, a create's attempt is recorded only if no other create of the user was recorded
        # since its check read the user's admission version; else it checks again, now counting
        # that one (front/records.py: admission). So two creates cannot both pass the check for the
        # last slot, and no write is spent on taking turns.
        async with self._one_user(spec.user_id), self.placement.exclusive(spec.key):
            await self.placement.recorded(spec.user_id)
            for _ in range(ADMISSION_TRIES):
                q = await self.quotas(spec.user_id)
                stored = await self.store.read(self.records.admission, spec.key, self._week_start(q), self.clock.now())
                if known := stored.answer:
                    span.add_event("duplicate request", {"session.id": known})
                    resp = await call(self.fleet.for_session(known).sessions.Get, cluster_pb.GetRequest(session_id=known))
                    return session_pb.CreateSessionResponse(session=checked(cluster_of(known), resp.session))
                blocks.check(self.store, spec.user_id)  # every session is a GPU session
                await self._check_quota(spec.user_id, spec.request_id, kind, q, stored)
                views = [c.view() for c in self.fleet.clients.values()]
                candidates = rank(views, spec.accelerator, image, spec.region_hint, spec.region_required,
                                  self.limits.regions.inter_region_penalty_s)
                for cand in candidates:
                    span.add_event("candidate", {"cluster": cand.cluster, "expected_s": cand.expected_s,
                                                 "how": cand.how, "region_penalty_s": cand.region_penalty_s,
                                                 "load": cand.load})
                if not candidates:
                    raise Unavailable(why_none(views, spec.accelerator, spec.region_hint, spec.region_required))
                first = self.fleet.clients[candidates[0].cluster]
                hold = first.hold(spec.accelerator, image)
                try:
                    session = await self.placement.place(request.spec, candidates, deadline, stored.version,
                                                         self.clock.now(), stored.sticky)
                except AdmissionChanged:
                    span.add_event("checked again", {"reason": "another create of the user was recorded"})
                    continue
                finally:
                    first.settle(hold)
                return session_pb.CreateSessionResponse(
                    session=session, placement_note=hint_note(views, candidates, spec.region_hint, session.cluster))
            raise Unavailable(f"creates of user {quote(spec.user_id)} keep arriving at other front replicas at "
                              "once; retry", retry_after_s=0.1)

    def _check_rate(self, user_id: str, caller: str) -> None:
        """Refuses a create over the user's or the caller's rate, before it waits for anything."""
        r = self.limits.rate_limits
        self._limit("creates", [(self.user_rates, user_id, r.creates_per_user_per_s, r.create_burst_per_user),
                                (self.caller_rates, caller, r.creates_per_caller_per_s, r.create_burst_per_caller)])

    def _check_reads(self, user_id: str) -> None:
        """Refuses a read that asks every cluster (a list, a quota) over the rate of the user it
        reads ("": every user's) or of its caller."""
        r, caller = self.limits.rate_limits, guard.current().caller.identity
        self._limit("reads", [(self.user_reads, user_id or "*", r.reads_per_user_per_s, r.read_burst_per_user),
                              (self.caller_reads, caller, r.reads_per_caller_per_s, r.read_burst_per_caller)])

    def _limit(self, what: str, limits: list[tuple[ratelimit.TokenBuckets, str, float, int]]) -> None:
        wait, which = ratelimit.take_all([(buckets, key) for buckets, key, _, _ in limits], self.rate_clock())
        if wait:
            _, key, rate, burst = limits[which]
            who = f"{('user', 'caller')[which]} {quote(key)}"
            trace.get_current_span().add_event("rate limited", {"rate.limit": ("user", "caller")[which]})
            raise RateLimited(f"too many {what}: {who} may make {rate:g} a second after a burst of {burst}; "
                              f"retry in {wait:.2f} s", retry_after_s=wait)

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

    def _metered(self, s: pb.Session) -> quota.Metered:
        ready = s.ready_time.ToNanoseconds() / 1e9
        end = s.end_time.ToNanoseconds() / 1e9
        # A pool no longer in the config meters as one GPU of weight 1.
        return quota.Metered(gpus=self.gpus.get((s.cluster, s.pool), 1.0),
                             ready_at=ready or None, ended_at=end or None)

    async def quotas(self, user_id: str) -> QuotaConfig:
        """The fleet's quotas with what operators set for this user, read from the shared store on
        each call, so that every front replica applies a change at once."""
        return self.limits.quotas.with_override((await self.store.read(self.store.operator.quota_override, user_id))[0])

    def _week_start(self, q: QuotaConfig) -> float:
        """Sessions that ended before this meter nothing this week."""
        return quota.week_window(self.clock.now(), q.reset_weekday, q.reset_hour_utc)[0]

    def _usage(self, sessions: list[pb.Session], ended: list[EndedRow], now: float, q: QuotaConfig) -> quota.Usage:
        """The user's week from the sessions listed (live, and those that ended since what `ended`,
        the rows remembered, holds)."""
        window = quota.week_window(now, q.reset_weekday, q.reset_hour_utc)
        rows, live_requests = [(r.metered, r.kind, False) for r in ended], set()
        for s in sessions:
            # Two live sessions of one request (a duplicate the resolver is discarding) are one
            # session to the user; both meter, as both held a GPU.
            live = s.state in LIVE_STATES and s.spec.request_id not in live_requests
            if live:
                live_requests.add(s.spec.request_id)
            rows.append((self._metered(s), KIND_NAMES.get(s.spec.kind, "interactive"), live))
        return quota.usage(rows, now, q.gpu_hours_per_week * 3600, window)

    async def _week(self, user_id: str, q: QuotaConfig, lenient: bool = True, made: list[Made] | None = None,
                    answered: set[str] | None = None) -> tuple[list[pb.Session], list[EndedRow]]:
        """A user's sessions that meter this week: those each cluster lists (the live ones and those
        ended since the latest end this front has seen there, brief), and the rows of the ended
        ones it remembers (front/ended_sessions.py). `lenient` as for _user_sessions. The ends of
        the `made` sessions (the store's, front/admission.py) that the lists show are recorded.
        `answered` is given the names of the clusters that listed."""
        week_start = self._week_start(q)
        timeout = ATTEMPT_TIMEOUT_S if lenient else None
        seen = self.ended_sessions
        ended_made: list[tuple[str, float]] = []

        async def one(c: ClusterClient) -> list[pb.Session]:
            asked_after, asked_at = seen.ask_after(user_id, c.name, week_start), self.clock.now()
            out = await listed(c, cluster_pb.ListRequest(user_id=user_id, ended_after=convert.timestamp(asked_after),
                                                         brief=True), timeout)
            seen.add(user_id, c.name, self.ended_rows(out), asked_at)
            if answered is not None:
                answered.add(c.name)
            if made:
                ended_made.extend(admission.ends_seen([m for m in made if m.cluster == c.name], out, asked_after))
            return [s for s in out if s.state in LIVE_STATES]

        sessions = await _from_each([c for c in self.fleet.clients.values() if c.healthy], one, user_id, lenient)
        ended = [row for c in self.fleet.clients for row in seen.rows(user_id, c, week_start)]
        # A cluster no longer in the fleet is not listed, and its sessions are not counted.
        gone = [(m.session_id, self.clock.now()) for m in made or () if m.cluster not in self.fleet.clients]
        if ended_made or gone:
            self._note_ends(user_id, ended_made + gone, made)
        return sessions, ended

    def ended_rows(self, listed: list[pb.Session]) -> list[tuple[str, float, EndedRow]]:
        """(id, end, metering row) of each ended session in a cluster's list."""
        return [self.ended_row(s) for s in listed if s.state not in LIVE_STATES]

    def ended_row(self, s: pb.Session) -> tuple[str, float, EndedRow]:
        """(id, end, metering row) of an ended session."""
        return s.id, s.end_time.ToNanoseconds() / 1e9, self._ended_row(s)

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
        """Waits for the ends and the answers being recorded (before the store closes)."""
        await asyncio.gather(*self._noting, self.placement.flush(), return_exceptions=True)

    def _ended_row(self, s: pb.Session) -> EndedRow:
        return EndedRow(self._metered(s), KIND_NAMES.get(s.spec.kind, "interactive"), s.spec.request_id)

    async def _check_quota(self, user_id: str, request_id: str, kind: str, q: QuotaConfig, a: Admission) -> None:
        """Refuses a new session over the user's active-session cap or without budget left: from the
        store alone when it proves the create within quota (front/admission.py), else from what
        the clusters list, with the user's placements under way elsewhere counted as live."""
        now, span = self.clock.now(), trace.get_current_span()
        why = admission.why_list(a, q.gpu_hours_per_week * 3600, q.max_active(kind), q.min_budget_to_start_s,
                                 self.max_gpus, self._live_when_listed.get(user_id, 0))
        if why is None:
            span.add_event("quota: within, from the store")
            return
        span.add_event("quota: listing the clusters", {"reason": why})
        made = [m for m in await self.store.read(self.records.made_not_seen_ended, user_id) if m.request_id != request_id]
        answered: set[str] = set()
        sessions, ended = await self._week(user_id, q, made=made, answered=answered)
        last_known = admission.unlisted(made, answered, a.placing)
        if last_known:
            self._note_last_known(user_id, last_known)
        if len(self._live_when_listed) >= MAX_USERS_LISTED:
            self._live_when_listed.clear()  # a cache: forgotten users are listed a little sooner
        self._live_when_listed[user_id] = len(sessions)
        # A session already made for this very request (its answer lost) is this create's own,
        # not one more: a retry must find it, never be refused for it.
        sessions = [s for s in sessions if s.spec.request_id != request_id]
        ended = [r for r in ended if r.request_id != request_id]
        usage = self._usage(sessions, ended, now, q)
        listed = {s.spec.request_id for s in sessions}
        # Not made yet, or not listed yet, or made at a cluster that did not list: one more each, of
        # this kind (the kind of a session only its cluster knows).
        placing = len(a.placing - listed) + len(last_known)
        if placing:
            usage = dataclasses.replace(usage, active=usage.active | {kind: usage.active.get(kind, 0) + placing})
        refusal = quota.check_create(usage, kind, q.max_active(kind), q.min_budget_to_start_s)
        if refusal is not None:
            span.add_event("quota refused", {"quota.subject": refusal.field})
            raise QuotaExceeded(refusal.message, field=refusal.field, reset_time=refusal.reset_time)

    def _note_last_known(self, user_id: str, last_known: list[Made]) -> None:
        by_cluster = Counter(m.cluster for m in last_known)
        self.fleet.counted_last_known.update(by_cluster.keys())
        log.warning("quota check of user %s: %s did not list; counting their sessions made there and not "
                    "seen to end as live", quote(user_id),
                    ", ".join(f"cluster {c} ({n} sessions)" for c, n in sorted(by_cluster.items())))

    @unary
    async def GetSession(self, request, context):
        # The answer carries the session's secret: a user's Get finds only that user's sessions
        # (another's is NOT_FOUND), service and admin callers find every one.
        resp = await call(self.fleet.for_session(request.session_id).sessions.Get,
                          cluster_pb.GetRequest(session_id=request.session_id, user_id=guard.current().owner,
                                                with_access_token=True))
        return session_pb.GetSessionResponse(session=checked(cluster_of(request.session_id), resp.session))

    async def _user_sessions(self, user_id: str, states, cluster: str = "", lenient: bool = False,
                             brief: bool = False) -> list[pb.Session]:
        """A user's sessions ("": every user's) on every reachable cluster, or on `cluster` only;
        `brief`: without their histories and notices. `lenient`: a cluster that fails to answer in
        ATTEMPT_TIMEOUT_S is left out (and logged) instead of failing the call, so a hung cluster
        does not hold up the caller."""
        timeout = ATTEMPT_TIMEOUT_S if lenient else None

        async def one(c: ClusterClient) -> list[pb.Session]:
            listing = await listed(c, cluster_pb.ListRequest(user_id=user_id, states=states, brief=brief), timeout)
            return [checked(c.name, s) for s in listing]

        live = [c for name, c in self.fleet.clients.items() if c.healthy and cluster in ("", name)]
        sessions = await _from_each(live, one, user_id, lenient)
        sessions.sort(key=lambda s: (-s.create_time.ToNanoseconds(), s.id))
        return sessions

    @unary
    async def ListSessions(self, request, context):
        user_id = request.user_id or guard.current().owner  # "" (every user's) only for service and admin
        self._check_reads(user_id)
        if request.cluster and request.cluster not in self.fleet.clients:
            raise NotFound(f"no cluster {quote(request.cluster)}; clusters: {', '.join(sorted(self.fleet.clients))}")
        if request.cluster and not self.fleet.clients[request.cluster].healthy:
            raise Unavailable(f"cluster {request.cluster} is unreachable")
        sessions = await self._user_sessions(user_id, list(request.states), request.cluster)
        items, token = page(sessions, request.page_size, request.page_token)
        return session_pb.ListSessionsResponse(sessions=items, next_page_token=token)

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
        for call in list(self._streams):
            call.cancel()

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
        self._check_reads(user_id)
        return session_pb.GetQuotaResponse(quota=await self.quota(user_id))

    async def quota(self, user_id: str) -> pb.Quota:
        """The user's limits in force (overrides applied) and this week's usage."""
        q = await self.quotas(user_id)
        sessions, ended = await self._week(user_id, q, lenient=False)
        now = self.clock.now()
        u = self._usage(sessions, ended, now, q)
        out = pb.Quota(
            user_id=user_id, gpu_hours_limit=q.gpu_hours_per_week, gpu_hours_used=u.used_s / 3600,
            gpu_hours_left=u.left_s / 3600, reset_time=convert.timestamp(u.reset_time),
            max_active_sessions=q.max_active("interactive"), active_sessions=u.active.get("interactive", 0),
            max_active_batch_sessions=q.max_active("batch"), active_batch_sessions=u.active.get("batch", 0))
        if (runs_out := quota.exhaustion_time(u, now)) is not None:
            out.exhaustion_time.CopyFrom(convert.timestamp(runs_out))
        return out


class FrontAdminServicer(BlockAdmin, admin_grpc.AdminServiceServicer):
    """Fleet-wide operator view; per-cluster actions are forwarded to the cluster."""

    def __init__(self, fleet: Fleet, audit: AuditLog, sessions: SessionServicer):
        self.fleet = fleet
        self.audit = audit
        self.sessions = sessions

    def _targets(self, cluster: str) -> list[ClusterClient]:
        return [self.fleet.get(cluster)] if cluster else [c for c in self.fleet.clients.values() if c.healthy]

    @unary
    async def ListClusters(self, request, context):
        async def one(c: ClusterClient) -> pb.Cluster:
            # Healthy means routable: its capacity stream is up and its circuit breaker lets calls through.
            view = c.view()
            out = pb.Cluster(name=c.name, region=c.region, address=c.address, healthy=view.healthy,
                             draining=view.draining)
            if view.healthy:
                try:
                    # Briefly, once: a hung cluster must not hold up the fleet's status.
                    resp = await call(c.admin.ListPools, admin_pb.ListPoolsRequest(cluster=c.name),
                                      STATUS_TIMEOUT_S, tries=1)
                    out.pools.extend(resp.pools)
                except RemoteError as err:
                    log.warning("cluster %s did not list its pools: %s", c.name, err.code.name)
            return out

        clusters = await asyncio.gather(*(one(c) for c in self.fleet.clients.values()))
        return admin_pb.ListClustersResponse(clusters=clusters)

    @unary
    async def ListPools(self, request, context):
        results = await asyncio.gather(*(call(c.admin.ListPools, admin_pb.ListPoolsRequest(cluster=c.name),
                                              ATTEMPT_TIMEOUT_S) for c in self._targets(request.cluster)))
        return admin_pb.ListPoolsResponse(pools=[p for r in results for p in r.pools])

    @unary
    async def DrainCluster(self, request, context):
        return await self._set_draining(request, "DrainCluster")

    @unary
    async def UndrainCluster(self, request, context):
        return await self._set_draining(request, "UndrainCluster")

    async def _set_draining(self, request, rpc: str):
        """Forwards, then lets the capacity stream carry the new flag before answering (bounded
        wait), so routing right after this call already sees it."""
        client = self.fleet.get(request.cluster)
        resp = await call(getattr(client.admin, rpc), request)
        want = rpc == "DrainCluster"

        async def carried() -> None:
            # An update already on its way may still carry the old flag: wait for the new one.
            while True:
                client.updated.clear()
                if client.capacity is not None and client.capacity.draining == want:
                    return
                await client.updated.wait()

        try:
            await asyncio.wait_for(carried(), timeout=2.0)
        except asyncio.TimeoutError:
            pass
        return resp

    @unary
    async def SetPoolPolicy(self, request, context):
        return await call(self.fleet.get(request.cluster).admin.SetPoolPolicy, request)

    @unary
    async def PrewarmImage(self, request, context):
        # Not idempotent (each call starts more VMs): sent once.
        return await call(self.fleet.get(request.cluster).admin.PrewarmImage, request, tries=1)

    @unary
    async def ListVms(self, request, context):
        results = await asyncio.gather(*(
            call(c.admin.ListVms, admin_pb.ListVmsRequest(cluster=c.name, pool=request.pool, states=request.states),
                 ATTEMPT_TIMEOUT_S) for c in self._targets(request.cluster)))
        return admin_pb.ListVmsResponse(vms=[vm for r in results for vm in r.vms])

    @unary
    async def EvictVm(self, request, context):
        # Sent once: a retry after a lost reply would fail because the VM is already gone.
        return await call(self.fleet.get(request.cluster).admin.EvictVm, request, tries=1)

    @unary
    async def ListAuditRecords(self, request, context):
        if request.cluster:  # that cluster's own log
            return await call(self.fleet.get(request.cluster).admin.ListAuditRecords, request, ATTEMPT_TIMEOUT_S)
        return audit_page(self.audit, request)

    @unary
    async def SetUserQuota(self, request, context):
        if not request.user_id:
            raise InvalidArgument("user_id must not be empty", field="user_id")
        store = self.sessions.store
        body = {} if request.clear else (await store.read(store.operator.quota_override, request.user_id))[0]
        if request.HasField("gpu_hours_per_week"):
            body["gpu_hours_per_week"] = request.gpu_hours_per_week
        caps = body.get("max_active_sessions_per_user", {})
        for kind, name in (("interactive", "max_active_sessions"), ("batch", "max_active_batch_sessions")):
            if request.HasField(name):
                caps[kind] = getattr(request, name)
        if caps:
            body["max_active_sessions_per_user"] = caps
        await store.commit(store.operator.save_quota_override, request.user_id, body, self.sessions.clock.now())
        return admin_pb.SetUserQuotaResponse(override=await self._override(request.user_id),
                                             quota=await self.sessions.quota(request.user_id))

    @unary
    async def GetUserQuota(self, request, context):
        if not request.user_id:
            raise InvalidArgument("user_id must not be empty", field="user_id")
        return admin_pb.GetUserQuotaResponse(override=await self._override(request.user_id),
                                             quota=await self.sessions.quota(request.user_id))

    async def _override(self, user_id: str) -> admin_pb.QuotaOverride:
        store = self.sessions.store
        body, updated = await store.read(store.operator.quota_override, user_id)
        out = admin_pb.QuotaOverride(user_id=user_id)
        if "gpu_hours_per_week" in body:
            out.gpu_hours_per_week = body["gpu_hours_per_week"]
        caps = body.get("max_active_sessions_per_user", {})
        if "interactive" in caps:
            out.max_active_sessions = caps["interactive"]
        if "batch" in caps:
            out.max_active_batch_sessions = caps["batch"]
        if updated is not None:
            out.update_time.CopyFrom(convert.timestamp(updated))
        return out


# AdminService RPCs a cluster does not serve (its policy refuses them): quotas and blocks are the front's.
FRONT_ONLY_ADMIN_RPCS = ("SetUserQuota", "GetUserQuota", *BLOCK_RPCS)

SERVICE_NAMES = (
    session_pb.DESCRIPTOR.services_by_name["SessionService"].full_name,
    admin_pb.DESCRIPTOR.services_by_name["AdminService"].full_name,
)


def register(server, servicer: SessionServicer):
    session_grpc.add_SessionServiceServicer_to_server(servicer, server)
    audit = AuditLog(servicer.store, servicer.clock)
    admin_grpc.add_AdminServiceServicer_to_server(FrontAdminServicer(servicer.fleet, audit, servicer), server)
    return SERVICE_NAMES


async def listed(c: ClusterClient, request: cluster_pb.ListRequest, timeout: float | None,
                 page_size: int | None = None, pause_s: float = 0.0) -> list[pb.Session]:
    """Every page of one cluster's answer to `request` (pages of `page_size`, default the most a
    cluster gives), waiting `pause_s` of wall time between pages."""
    request.page_size, out = page_size or (MAX_BRIEF_PAGE_SIZE if request.brief else MAX_PAGE_SIZE), []
    while True:
        resp = await call(c.sessions.List, request, timeout)
        out += resp.sessions
        if not resp.next_page_token:
            return out
        request.page_token = resp.next_page_token
        if pause_s:
            await asyncio.sleep(pause_s)


async def _from_each(clients: list[ClusterClient], one, user_id: str, lenient: bool) -> list[pb.Session]:
    """`one(cluster)` on every cluster at once, added up; with `lenient`, a cluster that fails is
    left out (and logged) instead of failing the call."""
    results = await asyncio.gather(*(one(c) for c in clients), return_exceptions=lenient)
    sessions: list[pb.Session] = []
    for c, r in zip(clients, results):
        if isinstance(r, BaseException):
            if not isinstance(r, Exception):
                raise r
            log.warning("cluster %s did not list the sessions of user %s; they are not counted: %s",
                        c.name, quote(user_id), r)
        else:
            sessions += r
    return sessions
