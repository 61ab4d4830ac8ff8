"""The cluster refuses an Allocate that arrives after its commit_by, on the wall clock it is given."""

from __future__ import annotations

import asyncio

import grpc
from core_driver import make_core

from provisioner.common.clock import ManualClock
from provisioner.cloud.sim import SimCloud
from provisioner.cluster import service as cluster_service
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import cluster_service_pb2_grpc as cluster_grpc
from provisioner.v1 import types_pb2 as pb

WALL = 1_800_000_000.0


def request(request_id: str, commit_by: float) -> cluster_pb.AllocateRequest:
    spec = pb.SessionSpec(request_id=request_id, user_id="ada", accelerator="gpu-p100", image="gpu:latest")
    return cluster_pb.AllocateRequest(spec=spec, commit_by={"seconds": int(commit_by)})


def test_an_allocate_past_its_commit_by_makes_nothing_and_one_in_time_is_made():
    async def run():
        core = make_core(min_vms=0, headroom_fraction=0.0)
        clock = ManualClock(start=0.0)  # the runtime's model time, far from the wall's
        runtime = ClusterRuntime(core, SimCloud(core.config.sim, clock, tracer=None, record_calls=False), clock)
        await runtime.start()
        server = grpc.aio.server()
        cluster_service.register(server, runtime, "", wall=ManualClock(start=WALL))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = cluster_grpc.ClusterServiceStub(channel)
                try:
                    await stub.Allocate(request("late", WALL - 1))
                    raise AssertionError("a late Allocate was served")
                except grpc.aio.AioRpcError as e:
                    assert e.code() is grpc.StatusCode.ABORTED and "commit deadline" in e.details()
                assert not core.sessions
                made = await stub.Allocate(request("in-time", WALL + 1))
                assert made.session.id in core.sessions
                # A late retry of a request already made is answered with its session.
                again = await stub.Allocate(request("in-time", WALL - 1))
                assert again.session.id == made.session.id
        finally:
            await server.stop(None)
            await runtime.close()

    asyncio.run(run())
