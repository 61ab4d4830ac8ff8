"""The agent's usage report: /proc's TCP tables parsed from sample text and read live from this
machine's /proc with real sockets, and the report's bounds."""

from __future__ import annotations

import ipaddress
import json
import os
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.agent import procnet
from provisioner.agent.guest import MAX_VALUE
from provisioner.agent.host import LocalHost
from provisioner.agent.usage import (MAX_CONNECTIONS, MAX_GPU_PROCESSES, MAX_GPUS, MAX_NAME, MAX_PROCESSES,
                                     Connection, Usage, collect)

# Copied from a Linux host: a listener on 0.0.0.0:8888, a connection it accepted from 10.0.0.9,
# an outbound connection to 1.2.3.4:3333, one being made to 5.6.7.8:14444, one closing.
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:22B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 5001 1 0000000000000000 100 0 0 10 0
   1: 0A00000A:22B8 0900000A:D431 01 00000000:00000000 00:00000000 00000000  1000        0 5002 1 0000000000000000 20 4 30 10 -1
   2: 0A00000A:9C40 04030201:0D05 01 00000000:00000000 02:000004F1 00000000  1000        0 5003 2 0000000000000000 20 4 30 10 -1
   3: 0A00000A:9C41 08070605:386C 02 00000001:00000000 01:00000064 00000002  1000        0 5004 2 0000000000000000 1000 0 0 10 -1
   4: 0A00000A:9C42 04030201:01BB 08 00000000:00000000 00:00000000 00000000  1000        0 5005 1 0000000000000000 20 4 1 10 -1
   5: garbage
"""
# IPv6: an outbound connection to 2001:db8::1 port 443, one to 1.2.3.4:4444 through an
# IPv4-mapped address, and a listener on [::]:8888.
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:22B8 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 6001 1 0000000000000000 100 0 0 10 0
   1: B80D0120000000000000000002000000:A000 B80D0120000000000000000001000000:01BB 01 00000000:00000000 00:00000000 00000000  1000        0 6002 1 0000000000000000 20 4 30 10 -1
   2: 0000000000000000FFFF00000A00000A:A001 0000000000000000FFFF000004030201:115C 01 00000000:00000000 00:00000000 00000000  1000        0 6003 1 0000000000000000 20 4 30 10 -1
"""


def test_the_ipv4_table_parses_to_ends_states_and_inodes():
    sockets = procnet.parse_tcp(TCP, "little")
    assert len(sockets) == 5  # the garbage line is skipped
    assert sockets[0] == procnet.Socket(Connection("0.0.0.0", 8888), Connection("0.0.0.0", 0), procnet.LISTEN, 5001)
    assert sockets[2] == procnet.Socket(Connection("10.0.0.10", 40000), Connection("1.2.3.4", 3333),
                                        procnet.ESTABLISHED, 5003)
    assert sockets[3].remote == Connection("5.6.7.8", 14444) and sockets[3].state == procnet.SYN_SENT


def test_the_ipv6_table_parses_and_mapped_addresses_read_as_ipv4():
    sockets = procnet.parse_tcp(TCP6, "little")
    assert [s.remote for s in sockets] == [Connection("::", 0), Connection("2001:db8::1", 443),
                                           Connection("1.2.3.4", 4444)]
    assert str(sockets[1].remote) == "[2001:db8::1]:443" and str(sockets[2].remote) == "1.2.3.4:4444"


def _kernel_hex(address: str, byteorder: str) -> str:
    """An address as /proc/net/tcp prints it (each 32-bit word in host order, %08X)."""
    raw = ipaddress.ip_address(address).packed
    return "".join(f"{int.from_bytes(raw[i:i + 4], byteorder):08X}" for i in range(0, len(raw), 4))


@given(st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)), st.integers(0, 65535), st.integers(0, 2 ** 32),
       st.sampled_from(["little", "big"]))
def test_any_address_and_port_printed_as_the_kernel_does_parses_back(ip, port, inode, byteorder):
    line = (f"   0: {_kernel_hex(str(ip), byteorder)}:1F90 {_kernel_hex(str(ip), byteorder)}:{port:04X} 01 "
            f"00000000:00000000 00:00000000 00000000  1000        0 {inode} 1 0000000000000000 20 4 30 10 -1")
    (sock,) = procnet.parse_tcp("header\n" + line, byteorder)
    mapped = ip.ipv4_mapped if ip.version == 6 else None
    assert sock.remote == Connection(str(mapped or ip), port) and sock.local.port == 8080 and sock.inode == inode


def test_a_big_endian_host_prints_words_the_other_way():
    sockets = procnet.parse_tcp(TCP.replace("04030201:0D05", "01020304:0D05"), "big")
    assert sockets[2].remote == Connection("1.2.3.4", 3333)


def test_outbound_keeps_the_processes_connections_out_and_leaves_accepted_ones():
    table = procnet.parse_tcp(TCP, "little") + procnet.parse_tcp(TCP6, "little")
    every = {5001, 5002, 5003, 5004, 5005, 6001, 6002, 6003}
    assert procnet.outbound(table, every) == [Connection("1.2.3.4", 3333), Connection("5.6.7.8", 14444),
                                              Connection("2001:db8::1", 443), Connection("1.2.3.4", 4444)]
    assert procnet.outbound(table, {5003}) == [Connection("1.2.3.4", 3333)]  # only these processes' sockets
    assert procnet.outbound(table, {5002, 5005}) == []  # accepted by the notebook server; closing


def _pair(family: int, host: str) -> tuple[socket.socket, socket.socket, socket.socket, int]:
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection((host, port))
    accepted, _ = server.accept()
    return server, client, accepted, port


def test_this_process_connections_are_read_from_the_real_proc():
    server, client, accepted, port = _pair(socket.AF_INET, "127.0.0.1")
    try:
        found = LocalHost().connections([os.getpid()])
        assert Connection("127.0.0.1", port) in found  # the client's connection out
        assert Connection("127.0.0.1", client.getsockname()[1]) not in found  # the server's accepted side
        client.close()
        accepted.close()
        assert Connection("127.0.0.1", port) not in LocalHost().connections([os.getpid()])
    finally:
        for s in (server, client, accepted):
            s.close()


def test_ipv6_connections_are_read_from_the_real_proc():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        server, client, accepted, port = _pair(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        assert Connection("::1", port) in LocalHost().connections([os.getpid()])
    finally:
        for s in (server, client, accepted):
            s.close()


def test_processes_that_do_not_exist_or_ended_are_skipped():
    assert LocalHost().connections([2 ** 22 + 12345]) == []


def test_a_report_is_bounded_and_its_json_fits_a_guest_attribute():
    names = [f"/opt/very/long/path/{i:03d}{'p' * 60}" for i in range(200)]
    conns = [Connection(f"2001:db8:ffff:ffff:ffff:ffff:ffff:{i:x}", 65535) for i in range(100)]
    conns.append(Connection("1.2.3.4", 3333))
    report = collect([100] * 40, names, names, conns)
    assert len(report.processes) == MAX_PROCESSES and len(report.gpu_processes) == MAX_GPU_PROCESSES
    assert all(len(n) == MAX_NAME and "/" not in n for n in report.processes)
    assert len(report.connections) == MAX_CONNECTIONS and len(report.gpu_utilization_pct) == MAX_GPUS
    assert report.connections[0] == Connection("1.2.3.4", 3333)  # a public address outranks the rest
    assert report.omitted_connections == 101 - MAX_CONNECTIONS
    assert report.omitted_processes == 200 - MAX_PROCESSES + 200 - MAX_GPU_PROCESSES
    assert len(report.to_json()) <= MAX_VALUE
    assert Usage.from_json(report.to_json()) == report


@given(st.text(min_size=0, max_size=300))
def test_decoding_anything_a_vm_sends_is_a_report_or_a_value_error(raw):
    try:
        report = Usage.from_json(raw)
    except ValueError:
        return
    assert len(report.processes) <= MAX_PROCESSES and len(report.connections) <= MAX_CONNECTIONS


def test_a_decoded_report_is_capped_even_if_the_vm_sends_more():
    raw = json.dumps({"gpu_utilization_pct": [250, -3], "processes": ["x" * 500] * 100,
                      "connections": [["1.2.3.4", 3333]] * 100})
    report = Usage.from_json(raw)
    assert report.gpu_utilization_pct == (100, 0) and report.gpu_busiest_pct == 100
    assert len(report.processes) == MAX_PROCESSES and len(report.processes[0]) == MAX_NAME
    assert len(report.connections) == MAX_CONNECTIONS
    with pytest.raises(ValueError):
        Usage.from_json('{"connections": [["1.2.3.4"]]}')
    with pytest.raises(ValueError):
        Usage.from_json("[1, 2]")
