"""A local gRPC fake of GKE's ClusterManager, for the real google-cloud-container client: the
methods the gke backend uses (GetCluster, GetNodePool, SetNodePoolSize, GetOperation).

A node pool's nodes are instances of a managed instance group in the fake Compute server, so a
resize shows there as nodes appearing and disappearing. Fault injection: a zone stocked out
(the resize operation fails), the next N calls answering UNAVAILABLE or RESOURCE_EXHAUSTED
(rate limited), slow operations. Every call is logged.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import grpc
from google.cloud.container_v1 import types
from google.rpc import status_pb2

from fake_compute import FakeCompute

SERVICE = "google.container.v1.ClusterManager"


@dataclass
class Pool:
    name: str
    machine_type: str
    accelerator: str
    accelerator_count: int
    zone: str
    size: int = 0
    other_zones: tuple[str, ...] = ()  # a multi-zone node pool (only shown, never resized)


@dataclass
class Call:
    method: str
    name: str
    node_count: int | None = None
    code: str = "OK"


@dataclass
class FakeClusterManager:
    compute: FakeCompute
    project: str
    location: str
    cluster: str
    pools: dict[str, Pool] = field(default_factory=dict)
    op_s: float = 0.05
    log: list[Call] = field(default_factory=list)
    stocked_out: set[str] = field(default_factory=set)
    failing: dict[str, list[grpc.StatusCode]] = field(default_factory=dict)

    def __post_init__(self):
        self._ids = itertools.count(1)
        self._ops: dict[str, tuple[float, types.Operation]] = {}
        self._server: grpc.aio.Server | None = None
        self.address = ""

    def add_pool(self, name: str, machine_type: str, accelerator: str, count: int, zone: str,
                 other_zones: tuple[str, ...] = ()) -> None:
        self.pools[name] = Pool(name, machine_type, accelerator, count, zone, other_zones=other_zones)
        self.compute.resize_group(self.project, zone, self.group(name), 0)

    def group(self, pool: str) -> str:
        return f"gke-{self.cluster}-{pool}-grp"

    def resizes(self, pool: str) -> list[int]:
        return [c.node_count for c in self.log if c.method == "SetNodePoolSize" and c.name.endswith(f"/{pool}")
                and c.code == "OK"]

    def fail_next(self, method: str, code: grpc.StatusCode, count: int = 1) -> None:
        self.failing.setdefault(method, []).extend([code] * count)

    # ---- the service ------------------------------------------------------------------------

    def _cluster_name(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/clusters/{self.cluster}"

    def _pool_pb(self, p: Pool) -> types.NodePool:
        return types.NodePool(
            name=p.name, initial_node_count=p.size, locations=[p.zone, *p.other_zones],
            status=types.NodePool.Status.RUNNING,
            config=types.NodeConfig(machine_type=p.machine_type, accelerators=[
                types.AcceleratorConfig(accelerator_type=p.accelerator, accelerator_count=p.accelerator_count)]),
            instance_group_urls=[f"https://www.googleapis.com/compute/v1/projects/{self.project}/zones/{z}/"
                                 f"instanceGroupManagers/{self.group(p.name)}" for z in (p.zone, *p.other_zones)])

    async def _check(self, method: str, name: str, context, node_count: int | None = None) -> None:
        call = Call(method, name, node_count)
        self.log.append(call)
        if self.failing.get(method):
            call.code = self.failing[method].pop(0).name
            await context.abort(grpc.StatusCode[call.code], f"injected {call.code}")

    async def get_cluster(self, request: types.GetClusterRequest, context) -> types.Cluster:
        await self._check("GetCluster", request.name, context)
        if request.name != self._cluster_name():
            await context.abort(grpc.StatusCode.NOT_FOUND, f"cluster {request.name} not found")
        return types.Cluster(name=self.cluster, location=self.location,
                             node_pools=[self._pool_pb(p) for p in self.pools.values()])

    async def get_node_pool(self, request: types.GetNodePoolRequest, context) -> types.NodePool:
        await self._check("GetNodePool", request.name, context)
        return self._pool_pb(await self._pool(request.name, context))

    async def _pool(self, name: str, context) -> Pool:
        prefix, _, pool = name.rpartition("/nodePools/")
        if prefix != self._cluster_name() or pool not in self.pools:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"node pool {name} not found")
        return self.pools[pool]

    async def set_node_pool_size(self, request: types.SetNodePoolSizeRequest, context) -> types.Operation:
        await self._check("SetNodePoolSize", request.name, context, request.node_count)
        pool = await self._pool(request.name, context)
        op_id = f"operation-{next(self._ids)}"
        op = types.Operation(name=op_id, operation_type=types.Operation.Type.SET_NODE_POOL_SIZE,
                             status=types.Operation.Status.RUNNING, target_link=request.name, location=self.location)
        if pool.zone in self.stocked_out and request.node_count > pool.size:
            op.error = status_pb2.Status(code=8, message=f"ZONE_RESOURCE_POOL_EXHAUSTED in {pool.zone}")
            op.status_message = op.error.message
        else:
            pool.size = request.node_count
            self.compute.resize_group(self.project, pool.zone, self.group(pool.name), pool.size)
        self._ops[op_id] = (time.time() + self.op_s, op)
        return op

    async def get_operation(self, request: types.GetOperationRequest, context) -> types.Operation:
        await self._check("GetOperation", request.name, context)
        op_id = request.name.rsplit("/", 1)[-1]
        if op_id not in self._ops:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"operation {request.name} not found")
        done_at, op = self._ops[op_id]
        if time.time() >= done_at:
            op.status = types.Operation.Status.DONE
        return op

    async def start(self) -> FakeClusterManager:
        methods = {
            "GetCluster": (self.get_cluster, types.GetClusterRequest, types.Cluster),
            "GetNodePool": (self.get_node_pool, types.GetNodePoolRequest, types.NodePool),
            "SetNodePoolSize": (self.set_node_pool_size, types.SetNodePoolSizeRequest, types.Operation),
            "GetOperation": (self.get_operation, types.GetOperationRequest, types.Operation),
        }
        handlers = {name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.deserialize,
                                                               response_serializer=resp.serialize)
                    for name, (fn, req, resp) in methods.items()}
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        await self._server.start()
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
