"""The cluster's gRPC services: ClusterService for the front, AdminService for its own pools."""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
from collections import OrderedDict

from opentelemetry import trace

from provisioner.observability import telemetry
from provisioner.api import convert
from provisioner.api.keyset import Key, decode_position, encode_position
from provisioner.api.paging import MAX_BRIEF_PAGE_SIZE, MAX_PAGE_SIZE, audit_page, page_size
from provisioner.store.audit_log import AuditLog
from provisioner.api.status import stream, unary
from provisioner.common.clock import Clock, RealClock
from provisioner.cluster.listing import Filter, session_key
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.cluster.session_protos import SessionProtos
from provisioner.decide.pools import PoolState
from provisioner.model.states import SESSION_TERMINAL
from provisioner.model.errors import Aborted, InvalidArgument, NotFound, quote
from provisioner.model.records import Session, request_key
from provisioner.rules.quota import WEEK_S
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import cluster_service_pb2_grpc as cluster_grpc
from provisioner.v1 import types_pb2 as pb

# Wall seconds between two pushes, whatever the runtime's clock: at a high time scale a model
# second is a few milliseconds.
DEFAULT_CAPACITY_INTERVAL_S = 0.1
# A listing's matches are kept this long (wall seconds) for its next page, for this many listings.
LISTING_KEPT_S = 10.0
MAX_LISTINGS_KEPT = 16
# Sessions a List converts, and filters, between two turns of the event loop (a few milliseconds).
CONVERT_AT_ONCE = 256
FILTER_AT_ONCE = 2000
# The latest budget end a front may set (model seconds ahead): see SetBudgetEnd.
MAX_BUDGET_AHEAD_S = 2 * WEEK_S


def filter_sessions(sessions, user_id: str, states: list[int], ended_after: float | None = None) -> list[Session]:
    """The sessions a List asks for, newest first."""
    wanted = {convert.session_state_from_pb(s) for s in states}
    out = [s for s in sessions if (not user_id or s.spec.user_id == user_id) and (not wanted or s.state in wanted)
           and (ended_after is None or s.state not in SESSION_TERMINAL or s.ended_at >= ended_after)]
    out.sort(key=session_key, reverse=True)
    return out


async def filter_sessions_in_parts(sessions: list[Session], user_id: str, states: list[int],
                                   ended_after: float | None = None) -> list[Session]:
    """filter_sessions, yielding to the event loop between parts: a front's list of every session
    filters and sorts thousands (at 8,000 VMs its first page, converted, held every call 7-13 ms)."""
    parts: list[list[Session]] = []
    for i in range(0, len(sessions), FILTER_AT_ONCE):
        if i:
            await asyncio.sleep(0)
        parts.append(filter_sessions(sessions[i:i + FILTER_AT_ONCE], user_id, states, ended_after))
    if len(parts) <= 1:
        return parts[0] if parts else []
    # The sorted parts merged a part's worth at a time: one sort of them all took 4 ms at 10,000.
    out: list[Session] = []
    merged, total = heapq.merge(*parts, key=session_key, reverse=True), sum(map(len, parts))
    while len(out) < total:
        await asyncio.sleep(0)
        out += itertools.islice(merged, FILTER_AT_ONCE)
    return out


def _filter(request) -> Filter:
    def ns(name: str) -> int | None:
        return getattr(request, name).ToNanoseconds() if request.HasField(name) else None
    return Filter(frozenset(convert.session_state_from_pb(s) for s in request.states), ns("created_after"),
                  ns("created_before"))


def _annotate(session: Session) -> None:
    span = trace.get_current_span()
    span.set_attributes({
        telemetry.ATTR_SESSION_ID: session.id, telemetry.ATTR_CLUSTER: session.cluster,
        telemetry.ATTR_POOL: session.pool, telemetry.ATTR_IMAGE: session.image,
        telemetry.ATTR_START: session.start.value if session.start else "",
        telemetry.ATTR_REQUEST_ID: session.spec.request_id,
    })


class ClusterServicer(cluster_grpc.ClusterServiceServicer):
    def __init__(self, runtime: ClusterRuntime, wall: Clock):
        self.rt = runtime
        self.wall = wall
        # The matches of the listings whose later pages are still to be asked for, in order, and
        # when each was made (wall time): a later page neither filters and sorts every session in
        # memory again nor sees the order shift under it.
        self._listings: OrderedDict[tuple, tuple[float, list[Session]]] = OrderedDict()
        self._protos = SessionProtos()

    @unary
    async def Allocate(self, request, context):
        spec = convert.spec_from_pb(request.spec)
        # Wall time, as the front set it (the runtime's clock may run faster than the wall).
        late = request.HasField("commit_by") and self.wall.now() > request.commit_by.ToNanoseconds() / 1e9
        if late and not self.rt.reads.knows_request(spec.key):
            raise Aborted("the request arrived after its commit deadline; nothing was made")
        session = self.rt.allocate(spec)
        _annotate(session)
        response = cluster_pb.AllocateResponse()
        self._protos.fill(response.session, session, self.rt.clock.now())
        await self.rt.writer.durable()
        return response

    @unary
    async def Get(self, request, context):
        match request.WhichOneof("key"):
            case "session_id":
                session = self.rt.reads.get(request.session_id, request.user_id)
            case "request_id":
                if not request.user_id:
                    raise InvalidArgument("user_id is required with request_id (request ids are scoped by user)",
                                          field="user_id")
                session = self.rt.reads.get_by_request(request_key(request.user_id, request.request_id))
            case _:
                raise InvalidArgument("give session_id or request_id", field="key")
        response = cluster_pb.GetResponse()
        self._protos.fill(response.session, session, self.rt.clock.now())
        if request.with_access_token:  # the kept protos never hold it
            response.session.access_token = session.access_token
        await self.rt.writer.durable(session.id)  # nothing is told before it is durable
        return response

    @unary
    async def List(self, request, context):
        want, position = _filter(request), decode_position(request.page_token)
        limit = page_size(request.page_size, MAX_BRIEF_PAGE_SIZE if request.brief else MAX_PAGE_SIZE)
        if request.user_id and not request.HasField("ended_after"):  # a page of a user's list
            items, following = self.rt.reads.list_page(request.user_id, want, position, limit)
        else:  # every user's, or a quota's read of a user's recent sessions
            items, following = await self._whole_listing_page(request, want, position, limit)
        trace.get_current_span().set_attributes({telemetry.ATTR_LISTED: len(items)})
        now = self.rt.clock.now()
        response = cluster_pb.ListResponse(next_page_token=encode_position(following) if following else "")
        for i in range(0, len(items), CONVERT_AT_ONCE):
            if i:  # a page of thousands (a front's list of every session) holds up no other call
                await asyncio.sleep(0)
            for s in items[i:i + CONVERT_AT_ONCE]:
                self._protos.fill(response.sessions.add(), s, now, request.brief)
        if items:  # nothing is told before it is durable; the writes of other sessions are not waited for
            await self.rt.writer.durable(*(s.id for s in items))
        return response

    async def _whole_listing_page(self, request, want: Filter, position: Key | None,
                                  limit: int) -> tuple[list[Session], Key | None]:
        """A page of a listing made whole (filtered and sorted in memory), kept for its next pages."""
        ended_after = request.ended_after.ToNanoseconds() / 1e9 if request.HasField("ended_after") else None
        key = (request.user_id, tuple(request.states), ended_after, want.created_after, want.created_before)
        kept = self._listings.pop(key, None)
        if position is not None and kept is not None and self.wall.now() - kept[0] < LISTING_KEPT_S:
            made, sessions = kept
        else:
            made, sessions = self.wall.now(), [s for s in await filter_sessions_in_parts(
                self.rt.reads.sessions(request.user_id, ended_after), request.user_id, list(request.states), ended_after)
                if want.in_window(session_key(s))]
        trace.get_current_span().set_attributes({telemetry.ATTR_MATCHED: len(sessions)})
        # Newest first: the first session after the position is the first whose key is below it.
        start = 0 if position is None else bisect.bisect_left(range(len(sessions)), True,
                                                               key=lambda i: session_key(sessions[i]) < position)
        items = sessions[start:start + limit]
        if start + limit >= len(sessions):
            return items, None
        self._listings[key] = made, sessions
        while len(self._listings) > MAX_LISTINGS_KEPT:
            self._listings.popitem(last=False)
        return items, session_key(items[-1])

    @unary
    async def Touch(self, request, context):
        session = self.rt.touch(request.session_id, request.user_id)
        response = cluster_pb.TouchResponse()
        self._protos.fill(response.session, session, self.rt.clock.now())
        await self.rt.writer.durable()
        return response

    @unary
    async def Stop(self, request, context):
        session = self.rt.stop(request.session_id, request.reason, request.user_id)
        _annotate(session)
        response = cluster_pb.StopResponse()
        self._protos.fill(response.session, session, self.rt.clock.now())
        await self.rt.writer.durable()
        return response

    @stream
    async def Watch(self, request, context):
        async for session in self.rt.watchers.watch(request.session_id, request.after_revision, request.user_id):
            response = cluster_pb.WatchResponse()
            self._protos.fill(response.session, session, self.rt.clock.now())
            yield response

    @unary
    async def Discard(self, request, context):
        if not request.request_id:
            raise InvalidArgument("request_id must not be empty", field="request_id")
        if not request.user_id:
            raise InvalidArgument("user_id must not be empty (request ids are scoped by user)", field="user_id")
        key = request_key(request.user_id, request.request_id)
        discarded = self.rt.discard(key, request.reason)
        await self.rt.writer.durable()
        return cluster_pb.DiscardResponse(discarded=discarded)

    @unary
    async def SetBudgetEnd(self, request, context):
        if not request.session_id:
            raise InvalidArgument("session_id must not be empty", field="session_id")
        ends_at = request.end_time.ToNanoseconds() / 1e9 if request.HasField("end_time") else 0.0
        # The front's certificate is not a licence to run forever: a budget runs out at the latest
        # one fresh week's budget after the next reset (quota.exhaustion_time), so within two weeks.
        if ends_at > self.rt.clock.now() + MAX_BUDGET_AHEAD_S:
            raise InvalidArgument(f"end_time is more than {MAX_BUDGET_AHEAD_S / 86400:g} days ahead; no weekly "
                                  "GPU budget lasts that long", field="end_time")
        session = self.rt.set_budget_end(request.session_id, ends_at)
        response = cluster_pb.SetBudgetEndResponse()
        self._protos.fill(response.session, session, self.rt.clock.now())
        await self.rt.writer.durable()
        return response

    @unary
    async def SetBlockedUsers(self, request, context):
        self.rt.set_blocked_users(frozenset(request.user_ids))
        return cluster_pb.SetBlockedUsersResponse()

    @unary
    async def SetProjectQuota(self, request, context):
        if not request.quota.HasField("until"):
            raise InvalidArgument("quota.until must be set", field="quota.until")
        self.rt.tell_project_quota(convert.project_quota_from_pb(request.quota))
        return cluster_pb.SetProjectQuotaResponse()

    @stream
    async def WatchCapacity(self, request, context):
        interval = request.min_interval_s or DEFAULT_CAPACITY_INTERVAL_S
        sent: dict[str, pb.PoolCapacity] = {}  # what this stream was last told of each pool
        flags_sent = 0  # the number of the last flag this stream sent (all of them, first)
        while not self.rt.watchers.streams_closed:
            changed = self.rt.watchers.capacity_notice()
            capacity = capacity_pb(self.rt)
            news = [p for p in capacity.pools if sent.get(p.pool) != p]
            whole = not sent
            sent.update((p.pool, p) for p in news)
            if not whole:
                del capacity.pools[:]
                capacity.pools.extend(news)
            flags_sent, flagged = self.rt.watchers.flagged(flags_sent)
            yield cluster_pb.WatchCapacityResponse(capacity=capacity, changes_only=not whole,
                                                   abuse_flags=[convert.abuse_flag_to_pb(s.abuse) for s in flagged])
            await self.wall.sleep(interval)
            await changed.wait()


def pool_capacity_pb(rt: ClusterRuntime, pool: PoolState) -> pb.PoolCapacity:
    snap = rt.reads.snapshot(pool)
    name = pool.config.name
    by_image = rt.capacity.warm_by_image.get(name, {})  # exactly what an Allocate could be given now
    unhealthy = rt.capacity.unhealthy.get(name, 0)
    now = rt.clock.now()
    return pb.PoolCapacity(
        pool=pool.config.name, accelerator=pool.config.accelerator,
        warm_by_image=[pb.ImageCount(image=i, count=c) for i, c in sorted(by_image.items())],
        warm=snap.warm, booting=snap.starting, assigned=snap.assigned, queued=snap.queued, unhealthy=unhealthy,
        min_vms=pool.policy.min_vms, max_vms=pool.policy.max_vms, cold_start_s=rt.reads.cold_start_s(),
        stocked_out_zones=sorted(z for z, until in pool.stocked_out_until.items() if until > now),
    )


def capacity_pb(rt: ClusterRuntime) -> pb.ClusterCapacity:
    now, quota = rt.clock.now(), rt.core.project_quota
    return pb.ClusterCapacity(
        cluster=rt.reads.name, region=rt.reads.region, healthy=True, draining=rt.reads.draining,
        pools=[pool_capacity_pb(rt, p) for p in rt.reads.pools()],
        time=convert.timestamp(now),
        project_quota=convert.project_quota_to_pb(quota) if quota is not None and quota.until > now else None,
    )


def pool_pb(rt: ClusterRuntime, pool: PoolState) -> pb.Pool:
    c, p = pool.config, pool.policy
    return pb.Pool(
        cluster=rt.reads.name, name=c.name, accelerator=c.accelerator, machine_type=c.machine_type,
        zones=list(c.zones), hourly_price_usd=c.hourly_price_usd,
        policy=pb.PoolPolicy(min_vms=p.min_vms, max_vms=p.max_vms, headroom_fraction=p.headroom_fraction,
                             autoscaler=p.autoscaler, recycle=p.recycle),
        capacity=pool_capacity_pb(rt, pool),
    )


def cluster_pb_of(rt: ClusterRuntime, address: str) -> pb.Cluster:
    return pb.Cluster(name=rt.reads.name, region=rt.reads.region, address=address, healthy=True,
                      draining=rt.reads.draining, pools=[pool_pb(rt, p) for p in rt.reads.pools()])


class ClusterAdminServicer(admin_grpc.AdminServiceServicer):
    """Operator actions on this cluster. Requests naming another cluster are refused."""

    def __init__(self, runtime: ClusterRuntime, address: str, audit: AuditLog):
        self.rt = runtime
        self.address = address
        self.audit = audit

    def _check(self, cluster: str) -> None:
        if cluster and cluster != self.rt.reads.name:
            raise NotFound(f"this is cluster {self.rt.reads.name}, not {quote(cluster)}", field="cluster")

    @unary
    async def ListClusters(self, request, context):
        return admin_pb.ListClustersResponse(clusters=[cluster_pb_of(self.rt, self.address)])

    @unary
    async def ListPools(self, request, context):
        self._check(request.cluster)
        return admin_pb.ListPoolsResponse(pools=[pool_pb(self.rt, p) for p in self.rt.reads.pools()])

    @unary
    async def DrainCluster(self, request, context):
        self._check(request.cluster)
        self.rt.set_draining(True)
        await self.rt.writer.durable()
        return admin_pb.DrainClusterResponse(cluster=cluster_pb_of(self.rt, self.address))

    @unary
    async def UndrainCluster(self, request, context):
        self._check(request.cluster)
        self.rt.set_draining(False)
        await self.rt.writer.durable()
        return admin_pb.UndrainClusterResponse(cluster=cluster_pb_of(self.rt, self.address))

    @unary
    async def SetPoolPolicy(self, request, context):
        self._check(request.cluster)
        p = request.policy
        changes = {f: getattr(p, f) for f in ("min_vms", "max_vms", "headroom_fraction", "autoscaler", "recycle")
                   if p.HasField(f)}
        self.rt.set_policy(request.pool, changes, reset=request.reset)
        await self.rt.writer.durable()
        return admin_pb.SetPoolPolicyResponse(pool=pool_pb(self.rt, self.rt.reads.pool(request.pool)))

    @unary
    async def PrewarmImage(self, request, context):
        self._check(request.cluster)
        if request.count < 0:
            raise InvalidArgument("count must not be negative", field="count")
        count = request.count or 1
        vm_ids = self.rt.prewarm(request.pool, request.image, count)
        await self.rt.writer.durable()
        return admin_pb.PrewarmImageResponse(vm_ids=vm_ids)

    @unary
    async def ListVms(self, request, context):
        self._check(request.cluster)
        if request.pool:
            self.rt.reads.pool(request.pool)
        states = {convert.vm_state_from_pb(s) for s in request.states}
        vms = sorted((vm for vm in self.rt.reads.vms() if (not request.pool or vm.pool == request.pool)
                      and (not states or vm.state in states)), key=lambda vm: (vm.pool, vm.id))
        catalog = self.rt.reads.catalog
        return admin_pb.ListVmsResponse(vms=[convert.vm_to_pb(vm, vm.cache.images(catalog), self.rt.clock.now()) for vm in vms])

    @unary
    async def EvictVm(self, request, context):
        self._check(request.cluster)
        vm = self.rt.evict(request.vm_id, request.reason)
        response = admin_pb.EvictVmResponse(vm=convert.vm_to_pb(vm, vm.cache.images(self.rt.reads.catalog),
                                                                self.rt.clock.now()))
        await self.rt.writer.durable()
        return response

    @unary
    async def ListAuditRecords(self, request, context):
        self._check(request.cluster)
        return audit_page(self.audit, request)


SERVICE_NAMES = (
    cluster_pb.DESCRIPTOR.services_by_name["ClusterService"].full_name,
    admin_pb.DESCRIPTOR.services_by_name["AdminService"].full_name,
)


def register(server, runtime: ClusterRuntime, address: str, wall: Clock | None = None):
    """`wall`: the wall clock, which the front's commit_by deadlines are in (the runtime's clock
    may run faster)."""
    cluster_grpc.add_ClusterServiceServicer_to_server(ClusterServicer(runtime, wall or RealClock()), server)
    audit = AuditLog(runtime.store, runtime.clock, source=runtime.reads.name)
    admin_grpc.add_AdminServiceServicer_to_server(ClusterAdminServicer(runtime, address, audit), server)
    return SERVICE_NAMES
