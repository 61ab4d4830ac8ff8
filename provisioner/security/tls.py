"""gRPC credentials from TLS files, and the rule on plaintext listeners.

Servers re-read their files when they change (checked at each new connection), so a rotated
certificate is served without a restart. Channels read theirs when made: a process picks up a
rotated client certificate at its next start.
"""

from __future__ import annotations

import ipaddress
import logging

import grpc

from provisioner.security.pki import TlsFiles

log = logging.getLogger(__name__)


class PlaintextRefused(ValueError):
    pass


def server_credentials(files: TlsFiles, require_client_cert: bool) -> grpc.ServerCredentials:
    """TLS for a server; with `require_client_cert`, mutual TLS: a peer without a certificate
    signed by the CA does not get past the handshake."""
    seen = [files.mtime()]

    def config() -> grpc.ServerCertificateConfiguration:
        ca, chain, key = files.read()
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=ca)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        try:
            mtime = files.mtime()
            if mtime == seen[0]:
                return None
            fresh = config()
        except (OSError, ValueError) as e:  # mid-rotation (a file missing): keep serving the old pair
            log.warning("TLS files not reloaded: %s", e)
            return None
        seen[0] = mtime
        log.info("TLS certificate reloaded from %s", files.cert)
        return fresh

    return grpc.dynamic_ssl_server_credentials(config(), fetch, require_client_authentication=require_client_cert)


def channel_credentials(ca: bytes, cert: bytes | None = None, key: bytes | None = None) -> grpc.ChannelCredentials:
    """Trusts servers signed by `ca`; presents `cert` when given (mutual TLS)."""
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plaintext(address: str, allow_anywhere: bool) -> None:
    """A plaintext listener is only for this machine, unless an operator says otherwise (a mesh
    sidecar terminating TLS in front of it, say)."""
    if not allow_anywhere and not is_loopback(address):
        raise PlaintextRefused(f"refusing to serve plaintext on non-loopback address {address}: give TLS files, "
                               "or --plaintext-anywhere if something in front of it terminates TLS")
