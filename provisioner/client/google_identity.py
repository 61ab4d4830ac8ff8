"""A Google ID token from the metadata server of the VM (or GKE Workload Identity pod) the
client runs on, for callers whose front trusts Google as an issuer.

`format=full` is asked for: without it Google's token carries no `email` claim, and the front
names service accounts by their email (`identity_claim: email`).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request

from provisioner.client.errors import NoCredentials


def metadata_url() -> str:
    """The metadata server: $GCE_METADATA_HOST (as Google's client libraries read it), else the VM's."""
    return f"http://{os.environ.get('GCE_METADATA_HOST') or 'metadata.google.internal'}/computeMetadata/v1"


def id_token(audience: str, server: str | None = None, timeout_s: float = 10.0) -> str:
    """The instance's service account's ID token for `audience`, with its email in it."""
    server = server or metadata_url()
    query = urllib.parse.urlencode({"audience": audience, "format": "full"})
    req = urllib.request.Request(f"{server.rstrip('/')}/instance/service-accounts/default/identity?{query}",
                                 headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.read().decode().strip()
    except (urllib.error.URLError, OSError) as e:
        raise NoCredentials(f"no ID token from the metadata server ({server}): {e}") from None
