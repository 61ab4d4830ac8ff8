"""The front's connections to the regional clusters, and their live capacity views."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from dataclasses import dataclass, replace
from typing import Awaitable, Callable, Mapping, Sequence

import grpc

from provisioner.observability import telemetry
from provisioner.model.abuse_record import Decision
from provisioner.api import convert
from provisioner.common.clock import Clock
from provisioner.front.breaker import CircuitBreaker
from provisioner.front.cluster_reports import ReportRefused, capacity_problem
from provisioner.front.router import ClusterView, PoolView
from provisioner.common.grpc_options import RECEIVE_BUFFER
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import cluster_service_pb2_grpc as cluster_grpc
from provisioner.v1 import types_pb2 as pb

log = logging.getLogger(__name__)

RECONNECT_S = 1.0
# Pings when nothing has been heard for a second, so a cluster that hangs (not just one that
# dies and resets its connections) is noticed within about three seconds. grpc 1.85 times the
# ping out with ping_timeout_ms, not keepalive_timeout_ms. The cluster's server accepts them.
KEEPALIVE = [("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_timeout_ms", 2000),
             ("grpc.http2.ping_timeout_ms", 2000), ("grpc.keepalive_permit_without_calls", 1),
             ("grpc.http2.max_pings_without_data", 0), ("grpc.http2.min_time_between_pings_ms", 1000)]


@dataclass
class Hold:
    """A session routed to a cluster that its capacity stream may not show yet."""
    pool: str
    image: str
    settled_at_push: int | None = None  # the pushes received when its placement ended


class ClusterClient:
    """One cluster: its stubs, and its capacity as last streamed. Unhealthy while the stream is down."""

    def __init__(self, name: str, region: str, address: str, tracer_provider=None,
                 interceptors: Sequence[grpc.aio.ClientInterceptor] = (), *,
                 credentials: grpc.ChannelCredentials, server_name: str, clock: Clock,
                 on_flags: Callable[[list[Decision]], Awaitable[object]] | None = None,
                 on_connect: Callable[[], object] | None = None, on_push: Callable[[], object] | None = None,
                 ceilings: Mapping[str, int] | None = None):
        """Mutual TLS: `credentials` carry the front's certificate, and the cluster must prove it
        is `server_name` (whatever address it is reached at). `clock` runs at wall speed: the
        breaker's waits and reconnects are network time. `on_flags` is given the abuse flags
        each push carries (blocks.apply_all), before the push's capacity is taken; `on_connect`
        is called at the first push of each capacity stream (the cluster may have restarted),
        `on_push` after each push is taken.
        `ceilings`: the cluster's pools and the most VMs each may hold by the fleet's config; a push
        beyond them (cluster_reports.capacity_problem) is not taken and ends the stream (None: not checked)."""
        self.name, self.region, self.address = name, region, address
        self.clock = clock
        self.on_flags, self.on_connect, self.on_push = on_flags, on_connect, on_push
        self.ceilings = ceilings
        self.channel = grpc.aio.secure_channel(
            address, credentials, options=[*KEEPALIVE, *RECEIVE_BUFFER, ("grpc.ssl_target_name_override", server_name)],
            interceptors=list(interceptors) or None)  # none in production: see rpc_tracing
        self.breaker = CircuitBreaker()
        traced = telemetry.traced_channel(self.channel, tracer_provider)
        self.sessions = cluster_grpc.ClusterServiceStub(traced)
        self.admin = admin_grpc.AdminServiceStub(traced)
        self.capacity: pb.ClusterCapacity | None = None
        self._pools: dict[str, PoolView] = {}  # the capacity as views, made once per push
        self.healthy = False
        self.updated = asyncio.Event()
        # Pushes are throttled, so a burst of creates would all see the same warm VMs and go to
        # the same cluster; each routed create holds one until a push after its placement ended.
        self._holds: dict[int, Hold] = {}
        self._held_pools: dict[str, PoolView] | None = None  # the pools less the holds, until either changes
        self._hold_ids = itertools.count()
        self._pushes = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow_capacity())

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.channel.close()

    async def _follow_capacity(self) -> None:
        while True:
            try:
                async for resp in self.sessions.WatchCapacity(cluster_pb.WatchCapacityRequest()):
                    if self.ceilings is not None and \
                            (problem := capacity_problem(self.name, resp.capacity, self.ceilings)):
                        raise ReportRefused(f"capacity push refused: {problem}")
                    # A flag that fails to apply ends the stream: the next one sends every flag again.
                    if resp.abuse_flags and self.on_flags is not None:
                        await self.on_flags([convert.abuse_flag_from_pb(f) for f in resp.abuse_flags])
                    if not self.healthy and self.on_connect is not None:
                        self.on_connect()
                    self.capacity, self.healthy = merged(self.capacity, resp), True
                    self._pools = pool_views(self.capacity)
                    self._pushes += 1
                    self._holds = {k: h for k, h in self._holds.items()
                                   if h.settled_at_push is None or h.settled_at_push >= self._pushes}
                    self._held_pools = None
                    self.updated.set()
                    if self.on_push is not None:
                        self.on_push()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as err:
                if self.healthy:
                    log.warning("lost capacity stream of cluster %s: %s", self.name, err.code().name)
            except ReportRefused as e:
                log.warning("cluster %s: %s; unroutable until it sends capacity within its pools' bounds", self.name,
                            e.message, extra={"cluster": self.name})
            except Exception:
                log.exception("capacity stream of cluster %s failed", self.name)
            self.healthy = False
            await self.clock.sleep(RECONNECT_S)

    def hold(self, pool: str, image: str) -> int:
        """Counts a create routed here as taking a VM of `pool` until the cluster's pushes show it."""
        key = next(self._hold_ids)
        self._holds[key] = Hold(pool, image)
        if self._held_pools is not None and pool in self._held_pools:  # one more taken, as a batch would
            self._held_pools = {**self._held_pools, pool: taken(self._held_pools[pool], {image: 1})}
        return key

    def settle(self, key: int) -> None:
        """The create's placement ended: its hold goes with the next push received."""
        if hold := self._holds.get(key):
            hold.settled_at_push = self._pushes

    def view(self) -> ClusterView:
        cap = self.capacity
        if self._held_pools is None:  # after a push; a hold takes its VM from the view made before
            held: dict[str, Counter[str]] = {}
            for hold in self._holds.values():
                held.setdefault(hold.pool, Counter())[hold.image] += 1
            self._held_pools = {name: taken(pool, held[name]) if name in held else pool
                                for name, pool in self._pools.items()}
        routable = self.healthy and cap is not None and self.breaker.allows(self.clock.now())
        return ClusterView(self.name, self.region, routable, bool(cap and cap.draining), self._held_pools)

    def breaker_state(self) -> str:
        return self.breaker.state(self.clock.now())


def merged(known: pb.ClusterCapacity | None, resp: cluster_pb.WatchCapacityResponse) -> pb.ClusterCapacity:
    """The cluster's capacity after a push: whole, or the pools it names over those known."""
    if not resp.changes_only or known is None:
        return resp.capacity
    pools = {p.pool: p for p in known.pools}
    pools.update((p.pool, p) for p in resp.capacity.pools)
    out = pb.ClusterCapacity()
    out.CopyFrom(resp.capacity)
    del out.pools[:]
    out.pools.extend(pools.values())  # in the order first told
    return out


def pool_views(cap: pb.ClusterCapacity) -> dict[str, PoolView]:
    return {p.pool: PoolView(warm_by_image={ic.image: ic.count for ic in p.warm_by_image}, warm=p.warm,
                             booting=p.booting, assigned=p.assigned, queued=p.queued, max_vms=p.max_vms,
                             cold_start_s=p.cold_start_s)
            for p in cap.pools}


def taken(pool: PoolView, images: Mapping[str, int]) -> PoolView:
    """`pool` with one more session assigned per count of `images`, each on a warm VM with its
    image while one is left, then on any warm VM, then queued."""
    by_image = dict(pool.warm_by_image)
    for image, n in images.items():
        if by_image.get(image, 0) > 0:
            by_image[image] -= min(n, by_image[image])
    n = sum(images.values())
    on_warm = min(n, pool.warm)
    return replace(pool, warm_by_image=by_image, warm=pool.warm - on_warm, assigned=pool.assigned + on_warm,
                   queued=pool.queued + n - on_warm)
