"""The local fleet's dev tokens, minted with its key under the data dir (this needs the server's
packages); trusting the front and presenting a token live in `provisioner.client.credentials`."""

from __future__ import annotations

from pathlib import Path

from provisioner.security.tokens import KEY_FILE, mint

LOCAL_OPERATOR = "local-operator"  # what the CLI is against a local fleet (service and admin)


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
