"""What anyone who can reach a port may hold of a server: connections beyond the cap are closed at
once, a connection that never finishes its handshake is closed after the handshake timeout (not
gRPC's default 120 s), and anonymous health watches are capped."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from provisioner.api.guard import Guard
from provisioner.api.server import ConnectionLimits, Server


@pytest.fixture
async def server(request):
    srv = Server("127.0.0.1:0", lambda s: [], guard=Guard({}, identify=None), credentials=None,
                 connections=request.param)
    await srv.start()
    yield srv
    await srv.stop(0)


async def closed_within(sockets: list[socket.socket], timeout: float) -> dict[int, float]:
    """Which of `sockets` the server closed, and after how many seconds, within `timeout`."""
    start, closed = time.monotonic(), {}
    while time.monotonic() - start < timeout and len(closed) < len(sockets):
        await asyncio.sleep(0.02)
        for i, s in enumerate(sockets):
            if i in closed:
                continue
            try:
                if s.recv(64) == b"":
                    closed[i] = time.monotonic() - start
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed[i] = time.monotonic() - start
    return closed


@pytest.mark.parametrize("server", [ConnectionLimits(max_connections=10, handshake_timeout_s=1.0)], indirect=True)
async def test_idle_connections_are_capped_and_dropped_after_the_handshake_timeout(server):
    sockets = []
    try:
        for _ in range(15):  # TCP connections that never say a word
            s = socket.create_connection(("127.0.0.1", server.port))
            s.setblocking(False)
            sockets.append(s)
        closed = await closed_within(sockets, timeout=5.0)
    finally:
        for s in sockets:
            s.close()
    assert len(closed) == 15
    at_once = [t for t in closed.values() if t < 0.5]
    assert len(at_once) == 5  # beyond the cap of 10
    assert all(0.5 <= t < 3.0 for t in closed.values() if t >= 0.5)  # the handshake timeout, not 120 s


@pytest.mark.parametrize("server", [ConnectionLimits(health_watches=2)], indirect=True)
async def test_anonymous_health_watches_are_capped(server):
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        request = health_pb2.HealthCheckRequest(service="")
        first, second = stub.Watch(request), stub.Watch(request)
        for call in (first, second):
            assert (await call.read()).status == health_pb2.HealthCheckResponse.SERVING
        third = stub.Watch(request)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await third.read()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        first.cancel()
        for _ in range(100):  # the server hears of the cancel a moment later
            if server.health.watches < 2:
                break
            await asyncio.sleep(0.02)
        again = stub.Watch(request)
        assert (await again.read()).status == health_pb2.HealthCheckResponse.SERVING
        assert (await stub.Check(request)).status == health_pb2.HealthCheckResponse.SERVING  # Check is not capped
        second.cancel()
        again.cancel()
