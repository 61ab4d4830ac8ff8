"""A second fleet on the same ports or the same data dir exits at once, saying who holds them,
instead of sharing the ports (SO_REUSEPORT) or standing by behind the first."""

from __future__ import annotations

import socket

import grpc
import pytest

from local_up import Up, clusters_on_free_ports, ports_of
from provisioner.api.server import HealthPort
from provisioner.observability.metrics import Metrics
from provisioner.common.port_holder import PortTaken, holders


def test_the_holder_of_a_listening_port_is_found():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        [(pid, cmdline)] = holders(port)
        import os
        assert pid == os.getpid() and "python" in cmdline


async def test_health_and_metrics_ports_are_exclusive():
    first = HealthPort("127.0.0.1:0")
    await first.start()
    try:
        with pytest.raises(PortTaken, match=f"127.0.0.1:{first.port} .health.*pid"):
            HealthPort(f"127.0.0.1:{first.port}")
        metrics = Metrics()
        with pytest.raises(PortTaken, match=f"127.0.0.1:{first.port} .metrics"):
            await metrics.serve(f"127.0.0.1:{first.port}")
    finally:
        await first.stop()
    # and a plain grpc server with the option refuses to share a port grpc holds
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with pytest.raises(PortTaken):
            HealthPort(f"127.0.0.1:{port}")
    finally:
        await server.stop(0)


async def test_a_second_up_on_the_same_ports_exits_naming_the_port_and_its_holder(tmp_path):
    clusters = clusters_on_free_ports(tmp_path / "clusters")
    first = Up(clusters, tmp_path / "data")
    await first.started()
    try:
        code, err = await Up(clusters, tmp_path / "other").ends()
        assert code != 0, err
        assert "port is taken" in err and f"pid {first.proc.pid} (" in err and "provisioner up" in err, err
        assert any(f"127.0.0.1:{port} " in err for port in ports_of(clusters)), err
    finally:
        await first.stop()


async def test_a_second_up_on_the_same_data_dir_says_who_runs_it_and_exits(tmp_path):
    first = Up(clusters_on_free_ports(tmp_path / "clusters"), tmp_path / "data")
    await first.started()
    try:
        code, err = await Up(clusters_on_free_ports(tmp_path / "clusters2"), tmp_path / "data").ends()
        assert code == 1, err
        assert f"in use by pid {first.proc.pid} (" in err and "--data-dir" in err, err
        assert "standing by" not in err
    finally:
        await first.stop()
