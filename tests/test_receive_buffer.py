"""The project's long-lived channels keep a fixed receive buffer (provisioner/common/grpc_options.py), so
the window they offer stays above a loopback segment whatever the connection carried before: the
front's to each cluster, and the shipped client's to the front."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import grpc
import pytest

from provisioner import client as api
from provisioner.common.clock import RealClock
from provisioner.front.clusters import ClusterClient
from provisioner.common.grpc_options import RECEIVE_BUFFER
from provisioner.security.pki import ensure_local_pki, local_files


def _tcp_inodes_to(port: int) -> set[str]:
    """Socket inodes of this host's TCP connections whose remote port is `port`."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _receive_buffers_to(port: int) -> list[int]:
    """SO_RCVBUF of each socket of this process connected to `port`."""
    inodes = _tcp_inodes_to(port)
    sizes = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed since listed
        if target.startswith("socket:[") and target[8:-1] in inodes:
            with socket.socket(fileno=os.dup(int(fd))) as s:
                sizes.append(s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
    return sizes


def _fixed() -> int:
    """What SO_RCVBUF reads once RECEIVE_BUFFER is set: Linux doubles what is asked, after capping it
    at net.core.rmem_max. Autotuning would start at net.ipv4.tcp_rmem's default (131072 here)."""
    asked = dict(RECEIVE_BUFFER)["grpc.tcp_receive_buffer_size"]
    return 2 * min(asked, int(Path("/proc/sys/net/core/rmem_max").read_text()))


def _all_fixed(port: int) -> bool:
    """Every socket of this process connected to `port` has the fixed buffer, and there is one
    (a channel closed just before may still hold its own for a moment: it had the buffer too)."""
    sizes = _receive_buffers_to(port)
    return bool(sizes) and set(sizes) == {_fixed()}


@pytest.mark.asyncio
async def test_the_connection_to_a_cluster_has_a_fixed_receive_buffer():
    server = grpc.aio.server()
    port = server.add_secure_port("127.0.0.1:0", grpc.local_server_credentials())
    await server.start()
    client = ClusterClient("c1", "r1", f"127.0.0.1:{port}", credentials=grpc.local_channel_credentials(),
                           server_name="c1", clock=RealClock())
    try:
        await client.channel.channel_ready()
        assert _receive_buffers_to(port) == [_fixed()]  # one socket: the channel's
    finally:
        await client.channel.close()
        await server.stop(None)


@pytest.mark.asyncio
async def test_the_clients_connection_to_the_front_has_a_fixed_receive_buffer(tmp_path):
    tls = tmp_path / "tls"
    ensure_local_pki(tls, {"front": []})
    ca, chain, key = local_files(tls, "front").read()
    server = grpc.aio.server()
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, chain)]))
    await server.start()
    try:
        with api.Client(f"127.0.0.1:{port}", token="t", ca=ca) as sync_client:
            grpc.channel_ready_future(sync_client._channel).result(timeout=10)
            assert _all_fixed(port), _receive_buffers_to(port)
        async with api.AsyncClient(f"127.0.0.1:{port}", token="t", ca=ca) as async_client:
            await async_client._channel.channel_ready()
            assert _all_fixed(port), _receive_buffers_to(port)
    finally:
        await server.stop(None)
