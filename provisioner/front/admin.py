"""The front's AdminService: the fleet-wide operator view, each cluster's actions forwarded to
it, and what only the front keeps (users' quota overrides; blocked users, front/block_admin.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from provisioner.api import convert
from provisioner.api.paging import audit_page
from provisioner.api.status import RemoteError, unary
from provisioner.store.audit_log import AuditLog
from provisioner.model.errors import InvalidArgument
from provisioner.front.attempts import ATTEMPT_TIMEOUT_S
from provisioner.front.block_admin import BLOCK_RPCS, BlockAdmin
from provisioner.front.clusters import ClusterClient
from provisioner.front.retry import call
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import types_pb2 as pb

if TYPE_CHECKING:
    from provisioner.front.service import Fleet, SessionServicer

log = logging.getLogger(__name__)

STATUS_TIMEOUT_S = 1.0


class FrontAdminServicer(admin_grpc.AdminServiceServicer):
    """Fleet-wide operator view; per-cluster actions are forwarded to the cluster. Quotas and
    blocks are the front's own (FRONT_ONLY_ADMIN_RPCS)."""

    def __init__(self, fleet: Fleet, audit: AuditLog, sessions: SessionServicer):
        self.fleet = fleet
        self.audit = audit
        self.sessions = sessions
        self.blocks = BlockAdmin(sessions.store, sessions.clock, lambda: fleet.block_pusher)

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

        try:  # wall time on purpose, like a call's deadline: how long the operator's call waits
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

    @unary
    async def BlockUser(self, request, context):
        return await self.blocks.block(request)

    @unary
    async def UnblockUser(self, request, context):
        return await self.blocks.unblock(request)

    @unary
    async def GetUserBlock(self, request, context):
        return await self.blocks.get(request)

    @unary
    async def ListBlockedUsers(self, request, context):
        return await self.blocks.list_blocked(request)


# AdminService RPCs a cluster does not serve (its policy refuses them): quotas and blocks are the front's.
FRONT_ONLY_ADMIN_RPCS = ("SetUserQuota", "GetUserQuota", *BLOCK_RPCS)
