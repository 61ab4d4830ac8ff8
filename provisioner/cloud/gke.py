"""The GKE backend: each pool is a GPU node pool of a GKE cluster, and each VM one of its nodes.

- discovery: the cluster (`gke_cluster` in `gke_location`, default the cluster's region) and,
  per pool, the node pool whose nodes have the pool's machine type and GPUs;
- create: the node pool grows by one (setSize) and the node that appears in its managed instance
  group becomes the VM: its instance is labelled with our labels (cluster, pool, request id =
  our VM id), which is how nodes map to VMs, across restarts too;
- delete: that node's instance is deleted through its instance group (so GKE never picks which
  node goes: it may hold a session or a valuable cache), then the node pool's size is set to
  what is left, so the pool's declared size stays the truth;
- everything a node does as a VM (boot, the agent's pulls and wipes, health, listing by label)
  goes through Compute Engine as in the gce backend: a GKE node is a Compute Engine instance.
- a session's notebook container: not started (a node's runtime is containerd, not the Docker
  Engine API the agent drives); the session runs once its node holds the image, as before.
- stop and start: refused (an `invalid` failure, never retried). A node pool has no stopped
  nodes: GKE's auto-repair would recreate a node stopped under it, and its autoscaler and
  upgrades count on every node running. The standby tier (stopped VMs) needs backend gce.
- reconciliation sees our labelled nodes and every unlabelled node of our node pools (left by
  a create that died before labelling it), which no record claims and so is deleted.

Resizes of one node pool are serialized. The GPU node pools must be zonal (one zone, one
instance group): setSize counts nodes per zone, so growing a multi-zone node pool by one would
add a node in every zone; discovery refuses such a pool. The zone a node lands in is the node
pool's, whatever zone the cluster core chose, and the VM reports it; a stockout there is that
zone's.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from google.api_core import exceptions as gexc
from google.cloud import compute_v1
from google.cloud.container_v1 import ClusterManagerAsyncClient, types
from google.cloud.container_v1.services.cluster_manager.transports import ClusterManagerGrpcAsyncIOTransport

from provisioner.common.clock import Clock
from provisioner.cloud.base import LABEL_REQUEST, CloudFailure, CloudVm, LaunchSpec, NotebookRequest
from provisioner.cloud.gce import GceBackend, gce_labels
from provisioner.cloud.gce_errors import failure_of
from provisioner.cloud.gce_instance import vm_of
from provisioner.config import ClusterConfig, PoolConfig

log = logging.getLogger(__name__)

NO_STANDBY = ("backend gke cannot stop or start a VM: a GKE node pool keeps every node running (auto-repair "
              "would recreate a stopped node), so a pool on gke has no standby tier; use backend gce for it")


class NodePool:
    def __init__(self, name: str, zone: str, group: str):
        self.name = name  # projects/.../nodePools/NAME
        self.zone = zone
        self.group = group  # its managed instance group: the nodes
        self.lock = asyncio.Lock()


class GkeBackend(GceBackend):
    name = "gke"

    def __init__(self, cluster: ClusterConfig, clock: Clock, credentials=None):
        super().__init__(cluster, clock, credentials)
        cfg = self.config
        self.location = cfg.gke_location or cluster.region
        self.cluster_path = f"projects/{self.project}/locations/{self.location}/clusters/{cfg.gke_cluster}"
        self.groups = compute_v1.InstanceGroupManagersClient(credentials=self.credentials,
                                                             client_options=self.client_options)
        if cfg.gke_endpoint:
            # An emulator or fake: plain gRPC (api_endpoint alone would open TLS).
            transport = ClusterManagerGrpcAsyncIOTransport(channel=grpc.aio.insecure_channel(cfg.gke_endpoint))
            self.gke = ClusterManagerAsyncClient(transport=transport)
        else:
            self.gke = ClusterManagerAsyncClient(credentials=credentials)
        self._pools: dict[str, NodePool] = {}
        self._discovery = asyncio.Lock()
        self._where: dict[str, tuple[str, str]] = {}  # our VM id -> (instance name, zone)

    # ---- discovery ---------------------------------------------------------------------------

    async def _gke(self, method, **kwargs):
        """A ClusterManager call, retried on 429 and 5xx like every Compute call."""
        try:
            async for attempt in self._retrying():
                with attempt:
                    return await method(**kwargs, timeout=self.config.call_timeout_s)
        except gexc.GoogleAPICallError as err:
            raise _GkeError(failure_of(err, "")) from None

    async def node_pools(self) -> dict[str, NodePool]:
        """Our pools, each matched with the GKE node pool of its machine type and GPUs."""
        async with self._discovery:  # once: concurrent creates must share each pool's lock
            if not self._pools:
                self._pools = await self._discover()
        return self._pools

    async def _discover(self) -> dict[str, NodePool]:
        found = {}
        cluster = await self._gke(self.gke.get_cluster, name=self.cluster_path)
        for pool in self.cluster.pools:
            match = next((np for np in cluster.node_pools if _serves(np, pool)), None)
            if match is None:
                raise _GkeError(CloudFailure("invalid", f"GKE cluster {self.config.gke_cluster} has no node pool of "
                                                        f"{pool.machine_type} with {pool.accelerator_count} x "
                                                        f"{pool.accelerator} for pool {pool.name}"))
            if len(match.instance_group_urls) != 1:
                raise _GkeError(CloudFailure("invalid", f"node pool {match.name} spans "
                                                        f"{len(match.instance_group_urls)} zones; pool {pool.name} "
                                                        "needs a zonal node pool"))
            url = match.instance_group_urls[0]  # .../zones/ZONE/instanceGroupManagers/NAME
            zone, group = url.split("/zones/")[1].split("/")[0], url.rsplit("/", 1)[-1]
            found[pool.name] = NodePool(f"{self.cluster_path}/nodePools/{match.name}", zone, group)
        return found

    async def _nodes(self, pool: NodePool) -> list[tuple[str, str]]:
        """(instance name, zone) of every node of the node pool."""
        pages = await self._call(self.groups.list_managed_instances, project=self.project, zone=pool.zone,
                                 instance_group_manager=pool.group)
        return [(m.instance.rsplit("/", 1)[-1], pool.zone) for m in await self._all(pages)]

    async def _resize(self, pool: NodePool, size: int) -> CloudFailure | None:
        op = await self._gke(self.gke.set_node_pool_size, request=types.SetNodePoolSizeRequest(
            name=pool.name, node_count=size))
        name = f"projects/{self.project}/locations/{self.location}/operations/{op.name}"
        op = await self._poll(op, lambda o: o.status == types.Operation.Status.DONE,
                              lambda: self._gke(self.gke.get_operation, name=name), f"resize of {pool.name}", pool.zone)
        if isinstance(op, CloudFailure):
            return op
        if op.error and op.error.message:
            code = "stockout" if "ZONE_RESOURCE_POOL_EXHAUSTED" in op.error.message else (
                "quota" if "QUOTA" in op.error.message else "internal")
            return CloudFailure(code, op.error.message, pool.zone)  # type: ignore[arg-type]
        return None

    # ---- CloudBackend ------------------------------------------------------------------------

    async def where(self, vm_id: str, zone: str) -> tuple[str, str]:
        if vm_id not in self._where:
            await self._our_nodes(self.cluster.name)
        return self._where.get(vm_id, (vm_id, zone))

    async def create(self, spec: LaunchSpec) -> CloudVm | CloudFailure:
        try:
            pool = (await self.node_pools())[spec.pool]
            async with pool.lock:
                if (known := await self._made(spec.vm_id)) is not None:
                    return known  # an earlier attempt made it
                before = await self._nodes(pool)
                failure = await self._resize(pool, len(before) + 1)
                if failure is not None:
                    return failure
                fresh = [node for node in await self._nodes(pool) if node not in before]
                if not fresh:
                    return CloudFailure("unavailable", f"{pool.name} grew but no new node appeared", spec.zone)
                name, zone = fresh[0]
                labels = gce_labels(spec.labels)
                if (failure := await self._label(name, zone, labels)) is not None:
                    return failure
                self._where[spec.vm_id] = (name, zone)
                return CloudVm(spec.vm_id, zone, "provisioning", labels)
        except _GkeError as err:
            return err.failure
        except gexc.GoogleAPICallError as err:
            return failure_of(err, spec.zone)

    async def _label(self, name: str, zone: str, labels: dict[str, str]) -> CloudFailure | None:
        """Labels the new node as our VM. The node exists: a retryable failure is tried again (up to
        `operation_timeout_s`), since an unlabelled node would be taken for a stray."""
        deadline = self.clock.now() + self.config.operation_timeout_s
        while True:
            try:
                inst = await self._call(self.instances.get, project=self.project, zone=zone, instance=name)
                op = await self._call(self.instances.set_labels_unary, project=self.project, zone=zone,
                                      instance=name, instances_set_labels_request_resource=(
                                          compute_v1.InstancesSetLabelsRequest(labels={**inst.labels, **labels},
                                                                               label_fingerprint=inst.label_fingerprint)))
                failure = await self._wait(op, zone)
            except gexc.PreconditionFailed as err:  # labels changed under us: read them again
                failure = CloudFailure("unavailable", str(err), zone)
            except gexc.GoogleAPICallError as err:
                failure = failure_of(err, zone)
            if failure is None or not failure.retryable or self.clock.now() >= deadline:
                return failure
            await self.clock.sleep(self.config.poll_s)

    async def _made(self, vm_id: str) -> CloudVm | None:
        return next((vm for vm in await self._our_nodes(self.cluster.name) if vm.vm_id == vm_id), None)

    async def delete(self, vm_id: str, zone: str) -> CloudFailure | None:
        try:
            name, zone = await self.where(vm_id, zone)
            for pool in (await self.node_pools()).values():  # node pools may share a zone
                if pool.zone != zone:
                    continue
                async with pool.lock:  # the size set below counts the nodes left: no resize in between
                    nodes = await self._nodes(pool)
                    if (name, zone) not in nodes:
                        continue
                    op = await self._call(self.groups.delete_instances_unary, project=self.project, zone=zone,
                                          instance_group_manager=pool.group,
                                          instance_group_managers_delete_instances_request_resource=(
                                              compute_v1.InstanceGroupManagersDeleteInstancesRequest(
                                                  instances=[f"zones/{zone}/instances/{name}"])))
                    if (failure := await self._wait(op, zone)) is not None:
                        return failure
                    failure = await self._resize(pool, len(nodes) - 1)
                    self._where.pop(vm_id, None)
                    return failure
            self._where.pop(vm_id, None)
            return None  # already gone
        except _GkeError as err:
            return err.failure
        except gexc.GoogleAPICallError as err:
            return failure_of(err, zone)

    async def stop(self, vm_id: str, zone: str) -> CloudFailure | None:
        return CloudFailure("invalid", NO_STANDBY, zone)

    async def start(self, vm_id: str, zone: str) -> CloudVm | CloudFailure:
        return CloudFailure("invalid", NO_STANDBY, zone)

    async def start_notebook(self, vm_id: str, zone: str, request: NotebookRequest) -> str | CloudFailure:
        """A node's runtime is containerd, which the agent's engine (the Docker Engine API) cannot
        drive: no container is started here, and the session's endpoint is the node's."""
        return ""

    async def stop_notebook(self, vm_id: str, zone: str, session_id: str) -> CloudFailure | None:
        return None

    async def list_vms(self, cluster: str) -> list[CloudVm]:
        """Our labelled nodes, plus every unlabelled node of our node pools: a create that died
        between growing the node pool and labelling its node left it, and as a VM no record
        claims, the reconciler deletes it. A node pool with a create under way is skipped, since
        its new node is not labelled yet."""
        out = await self._our_nodes(cluster)
        named = {self._where[vm.vm_id][0] for vm in out}
        for pool in (await self.node_pools()).values():
            if not pool.lock.locked():
                out += [CloudVm(name, zone, "running") for name, zone in await self._nodes(pool) if name not in named]
        return out

    async def _our_nodes(self, cluster: str) -> list[CloudVm]:
        """The nodes labelled as our VMs; learns where each is."""
        out = []
        for inst, zone in await self._labelled(cluster):
            vm = vm_of(inst, zone)
            if vm.labels.get(LABEL_REQUEST):
                self._where[vm.vm_id] = (inst.name, zone)
                out.append(vm)
        return out

    async def close(self) -> None:
        await super().close()
        self.groups.transport.close()
        await self.gke.transport.close()


class _GkeError(Exception):
    def __init__(self, failure: CloudFailure):
        super().__init__(failure.message)
        self.failure = failure


def _serves(node_pool: types.NodePool, pool: PoolConfig) -> bool:
    cfg = node_pool.config
    return cfg.machine_type == pool.machine_type and any(
        a.accelerator_type == pool.accelerator and a.accelerator_count == pool.accelerator_count
        for a in cfg.accelerators)
