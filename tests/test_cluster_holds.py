"""A create routed to a cluster holds one of its VMs in the front's view of it until a capacity
push after its placement shows it (front/clusters.py): views made between pushes count every
hold taken since, and a push clears the settled ones."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from provisioner.common.clock import RealClock
from provisioner.front.clusters import ClusterClient
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import types_pb2 as pb

POOL = "gpu-p100"


def _push(warm_a: int) -> cluster_pb.WatchCapacityResponse:
    pool = pb.PoolCapacity(pool=POOL, warm=warm_a + 1, max_vms=10, cold_start_s=600.0,
                           warm_by_image=[pb.ImageCount(image="a", count=warm_a), pb.ImageCount(image="b", count=1)])
    return cluster_pb.WatchCapacityResponse(capacity=pb.ClusterCapacity(cluster="c1", pools=[pool]))


@pytest.mark.asyncio
async def test_views_count_the_holds_taken_since_the_last_push():
    client = ClusterClient("c1", "r1", "127.0.0.1:1", credentials=grpc.local_channel_credentials(),
                           server_name="c1", clock=RealClock())
    pushes: asyncio.Queue = asyncio.Queue()

    async def stream(request):
        while True:
            yield await pushes.get()

    client.sessions.WatchCapacity = stream  # the cluster's stream, fed by the test

    async def pushed(resp) -> None:
        before = client._pushes
        await pushes.put(resp)
        while client._pushes == before:
            await asyncio.sleep(0)

    client.start()
    try:
        await pushed(_push(warm_a=2))
        pool = client.view().pools[POOL]
        assert (pool.warm_by_image["a"], pool.warm, pool.assigned) == (2, 3, 0)
        first = client.hold(POOL, "a")
        pool = client.view().pools[POOL]
        assert (pool.warm_by_image["a"], pool.warm, pool.assigned) == (1, 2, 1)
        second = client.hold(POOL, "a")
        client.hold(POOL, "a")  # a third: no warm VM with "a" left, so any warm one
        pool = client.view().pools[POOL]
        assert (pool.warm_by_image["a"], pool.warm_by_image["b"], pool.warm, pool.assigned) == (0, 1, 0, 3)
        client._held_pools = None  # made again from every hold at once: the same view
        assert client.view().pools[POOL] == pool
        client.settle(first)
        client.settle(second)
        assert client.view().pools[POOL].assigned == 3  # settled, but no push has shown them yet
        await pushed(_push(warm_a=1))  # the cluster's view after the placements
        pool = client.view().pools[POOL]
        assert (pool.warm_by_image["a"], pool.warm, pool.assigned) == (0, 1, 1)  # the unsettled hold still takes one
    finally:
        await client.close()
