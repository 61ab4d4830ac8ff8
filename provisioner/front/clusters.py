"""The front's connections to the regional clusters, and their live capacity views."""

from __future__ import annotations

import asyncio
import logging

import grpc

from provisioner import telemetry
from provisioner.clock import Clock
from provisioner.front.router import ClusterView, PoolView
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import cluster_service_pb2_grpc as cluster_grpc
from provisioner.v1 import types_pb2 as pb

log = logging.getLogger(__name__)

RECONNECT_S = 1.0


class ClusterClient:
    """One cluster: its stubs, and its capacity as last streamed. Unhealthy while the stream is down."""

    def __init__(self, name: str, region: str, address: str, clock: Clock, tracer_provider=None):
        self.name, self.region, self.address = name, region, address
        self.clock = clock
        self.channel = grpc.aio.insecure_channel(
            address, interceptors=telemetry.client_interceptors(tracer_provider))
        self.sessions = cluster_grpc.ClusterServiceStub(self.channel)
        self.admin = admin_grpc.AdminServiceStub(self.channel)
        self.capacity: pb.ClusterCapacity | None = None
        self.healthy = False
        self.updated = asyncio.Event()
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
                    self.capacity, self.healthy = resp.capacity, True
                    self.updated.set()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as err:
                if self.healthy:
                    log.warning("lost capacity stream of cluster %s: %s", self.name, err.code().name)
            except Exception:
                log.exception("capacity stream of cluster %s failed", self.name)
            self.healthy = False
            await self.clock.sleep(RECONNECT_S)

    def view(self) -> ClusterView:
        cap = self.capacity
        pools = {}
        if cap is not None:
            for p in cap.pools:
                pools[p.pool] = PoolView(
                    warm_by_image={ic.image: ic.count for ic in p.warm_by_image}, warm=p.warm, booting=p.booting,
                    assigned=p.assigned, queued=p.queued, max_vms=p.max_vms, cold_start_s=p.cold_start_s)
        return ClusterView(self.name, self.region, self.healthy and cap is not None,
                           bool(cap and cap.draining), pools)
