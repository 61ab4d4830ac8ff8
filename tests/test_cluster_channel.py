"""The front's connection to a cluster keeps a fixed receive buffer (front/clusters.py), so the
window it offers stays above a loopback segment whatever the connection carried before."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import grpc
import pytest

from provisioner.clock import RealClock
from provisioner.front.clusters import RECEIVE_BUFFER, ClusterClient


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


@pytest.mark.asyncio
async def test_the_connection_to_a_cluster_has_a_fixed_receive_buffer():
    server = grpc.aio.server()
    port = server.add_secure_port("127.0.0.1:0", grpc.local_server_credentials())
    await server.start()
    client = ClusterClient("c1", "r1", f"127.0.0.1:{port}", credentials=grpc.local_channel_credentials(),
                           server_name="c1", clock=RealClock())
    try:
        await client.channel.channel_ready()
        # Linux doubles what is asked, after capping it at net.core.rmem_max; autotuning would
        # start at net.ipv4.tcp_rmem's default (131072 here) and move from there.
        asked = dict(RECEIVE_BUFFER)["grpc.tcp_receive_buffer_size"]
        cap = int(Path("/proc/sys/net/core/rmem_max").read_text())
        assert _receive_buffers_to(port) == [2 * min(asked, cap)]
    finally:
        await client.channel.close()
        await server.stop(None)
