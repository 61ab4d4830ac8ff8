"""Which token and CA a client uses: given ones, else the environment, else the local fleet's
(its CA under `<data dir>/tls/`, and a dev token minted with its key when the server's packages
are installed)."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from provisioner.client.errors import NoCredentials

LOCAL_CA = Path("tls") / "ca.pem"  # under the data dir, where `provisioner up` makes it


@dataclass(frozen=True)
class Credentials:
    token: str
    ca_pem: bytes | None  # None: the system's roots


def local_ca(data_dir: Path | str) -> Path:
    return Path(data_dir) / LOCAL_CA


def default_data_dir() -> Path:
    """$PROVISIONER_DATA_DIR, else the user's own: $XDG_DATA_HOME/provisioner (by default
    ~/.local/share/provisioner), the same wherever a command runs."""
    if env := os.environ.get("PROVISIONER_DATA_DIR"):
        return Path(env)
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "provisioner"


def resolve(token: str | None = None, ca: str | Path | bytes | None = None,
            data_dir: str | Path | None = None) -> Credentials:
    """The token: `token`, else $PROVISIONER_TOKEN, else the file $PROVISIONER_TOKEN_FILE, else
    with $PROVISIONER_ID_TOKEN_AUDIENCE the metadata server's Google ID token for it, else a
    `local-operator` dev token from the local fleet's key. The CA: `ca` (a path or PEM bytes),
    else $PROVISIONER_CA, else the local fleet's CA if there is one, else the system's roots."""
    data_dir = Path(data_dir) if data_dir else default_data_dir()
    token = token or os.environ.get("PROVISIONER_TOKEN")
    if not token and (token_file := os.environ.get("PROVISIONER_TOKEN_FILE")):
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            raise NoCredentials(f"cannot read the token file {token_file}: {e.strerror or e}") from None
    if not token and (audience := os.environ.get("PROVISIONER_ID_TOKEN_AUDIENCE")):
        from provisioner.client.google_identity import id_token  # on Google Cloud: its metadata server's

        token = id_token(audience)
    if not token:
        token = _dev_token(data_dir)
    if isinstance(ca, bytes):
        return Credentials(token, ca)
    ca_path, _ = _ca_path(ca, data_dir)
    try:
        ca_pem = Path(ca_path).read_bytes() if ca_path else None
    except OSError as e:
        raise NoCredentials(f"cannot read the CA certificate {ca_path}: {e.strerror or e}") from None
    return Credentials(token, ca_pem)


def _ca_path(ca: str | Path | None, data_dir: Path) -> tuple[str | Path | None, str]:
    """The CA file `resolve` reads (None: the system's roots), and where it comes from in words."""
    if ca:
        return ca, f"the CA {ca}"
    if env := os.environ.get("PROVISIONER_CA"):
        return env, f"the CA {env} ($PROVISIONER_CA)"
    if local_ca(data_dir).exists():
        return local_ca(data_dir), f"the local fleet's CA {local_ca(data_dir)}"
    return None, f"the system's roots (there is no local fleet's CA at {local_ca(data_dir)})"


def ca_source(ca: str | Path | bytes | None = None, data_dir: str | Path | None = None) -> str:
    """Which CA `resolve` trusts with these arguments, in words, for error messages."""
    if isinstance(ca, bytes):
        return "the CA given"
    return _ca_path(ca, Path(data_dir) if data_dir else default_data_dir())[1]


def _dev_token(data_dir: Path) -> str:
    try:  # minting needs the server's packages (PyJWT, cryptography)
        security = importlib.import_module("provisioner.security.client")
    except ImportError:
        raise NoCredentials("no credentials: give --token (or PROVISIONER_TOKEN)") from None
    try:
        return security.dev_token(data_dir)
    except FileNotFoundError as e:
        raise NoCredentials(f"no credentials: give --token (or PROVISIONER_TOKEN); {e}") from None


def server_name_options(server_name: str | None = None) -> list[tuple[str, str]]:
    """Channel options that check the front's certificate for `server_name` (else
    $PROVISIONER_SERVER_NAME) instead of the host dialled: for an address the certificate does not
    name, such as an internal load balancer's IP address."""
    name = server_name or os.environ.get("PROVISIONER_SERVER_NAME")
    return [("grpc.ssl_target_name_override", name)] if name else []


def front_credentials(ca_pem: bytes | None, token: str) -> grpc.ChannelCredentials:
    """TLS trusting `ca_pem` (None: the system's roots) with the token on every call."""
    return grpc.composite_channel_credentials(grpc.ssl_channel_credentials(root_certificates=ca_pem),
                                              grpc.access_token_call_credentials(token))


def bearer(token: str) -> tuple[tuple[str, str]]:
    """The call metadata that carries a token (for channels without call credentials)."""
    return (("authorization", f"Bearer {token}"),)
