"""A client's side of the fleet's security: trusting the front, presenting a token, and the
local fleet's defaults (its CA and a dev token minted with its key, both under the data dir)."""

from __future__ import annotations

from pathlib import Path

import grpc

from provisioner.security.pki import CA_CERT
from provisioner.security.tokens import KEY_FILE, mint

LOCAL_OPERATOR = "local-operator"  # what the CLI is against a local fleet (service and admin)


def local_ca(data_dir: Path) -> Path:
    return Path(data_dir) / "tls" / CA_CERT


def local_key(data_dir: Path) -> Path:
    return Path(data_dir) / "auth" / KEY_FILE


def dev_token(data_dir: Path, subject: str = LOCAL_OPERATOR, ttl_s: float = 3600.0) -> str:
    """A token for `subject` signed with the local fleet's key (made by `up`)."""
    path = local_key(data_dir)
    try:
        pem = path.read_bytes()
    except OSError:
        raise FileNotFoundError(f"no token signing key at {path}: start the local fleet once (provisioner up), "
                                "or give a token") from None
    return mint(pem, subject, ttl_s=ttl_s)


def front_credentials(ca_pem: bytes | None, token: str) -> grpc.ChannelCredentials:
    """TLS trusting `ca_pem` (None: the system's roots) with the token on every call."""
    return grpc.composite_channel_credentials(grpc.ssl_channel_credentials(root_certificates=ca_pem),
                                              grpc.access_token_call_credentials(token))


def bearer(token: str) -> tuple[tuple[str, str]]:
    """The call metadata that carries a token (for channels without call credentials)."""
    return (("authorization", f"Bearer {token}"),)
