"""TLS material: the local CA's certificates, and a server that serves a rotated certificate
without a restart."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time

import grpc
from cryptography import x509

from provisioner.security import tls
from provisioner.security.pki import ensure_local_pki, local_files


def served_certificate(port: int, ca_path) -> x509.Certificate:
    """The certificate a TLS server on loopback presents, read with a plain TLS client."""
    ctx = ssl.create_default_context(cafile=str(ca_path))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as conn:
            return x509.load_der_x509_certificate(conn.getpeercert(binary_form=True))


def test_local_pki_is_made_once_and_names_each_process(tmp_path):
    leaves = {"front": ["front.provisioner.internal"], "cluster-a": ["a.cluster.provisioner.internal"]}
    ensure_local_pki(tmp_path, leaves)
    front = local_files(tmp_path, "front")
    first = front.cert.read_bytes()
    ensure_local_pki(tmp_path, leaves)  # nothing changed: nothing reissued
    assert front.cert.read_bytes() == first
    cert = x509.load_pem_x509_certificate(first)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(san.get_values_for_type(x509.DNSName)) == ["front.provisioner.internal", "localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert oct(front.key.stat().st_mode & 0o777) == "0o600"
    # A name that changed in the config is reissued.
    ensure_local_pki(tmp_path, {**leaves, "front": ["front.example.internal"]})
    assert front.cert.read_bytes() != first


async def test_a_server_serves_a_rotated_certificate_without_a_restart(tmp_path):
    ensure_local_pki(tmp_path, {"front": ["front.provisioner.internal"]})
    files = local_files(tmp_path, "front")
    server = grpc.aio.server()
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(files, require_client_cert=False))
    await server.start()
    try:
        before = await asyncio.to_thread(served_certificate, port, files.ca)
        files.cert.unlink()
        ensure_local_pki(tmp_path, {"front": ["front.provisioner.internal"]})  # a new pair, same CA
        os.utime(files.cert, (time.time() + 5, time.time() + 5))  # a later mtime, however fast this ran
        after = await asyncio.to_thread(served_certificate, port, files.ca)
        assert after.serial_number != before.serial_number
        assert after.serial_number == x509.load_pem_x509_certificate(files.cert.read_bytes()).serial_number
    finally:
        await server.stop(None)
