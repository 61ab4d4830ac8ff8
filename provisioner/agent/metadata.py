"""The instance's metadata server: its attributes (wait-for-change, no polling) and guest attributes.

As on Compute Engine: every request carries `Metadata-Flavor: Google`; `attributes/?recursive=true`
answers the instance's custom metadata as JSON with an ETag, and with `wait_for_change=true&
last_etag=E` holds the answer until the metadata differs from E (or `timeout_sec` passes);
guest attributes are PUT and DELETEd under `instance/guest-attributes/<namespace>/<key>`.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Protocol

NAMESPACE = "provisioner"
HEADERS = {"Metadata-Flavor": "Google"}


class MetadataError(Exception):
    """The metadata server could not be reached or refused; the caller retries."""


class Metadata(Protocol):
    async def attributes(self, last_etag: str, timeout_s: float) -> tuple[dict[str, str], str]:
        """The instance's attributes and their ETag, once they differ from `last_etag` ("": now)."""
        ...

    async def value(self, path: str, last_etag: str, timeout_s: float) -> tuple[str, str]:
        """One metadata value (e.g. instance/maintenance-event) and its ETag, once it differs
        from `last_etag` ("": now)."""
        ...

    async def put_guest(self, key: str, value: str) -> None: ...

    async def delete_guest(self, key: str) -> None: ...

    async def access_token(self) -> str:
        """The VM's service-account access token (for the registry)."""
        ...


class HttpMetadata:
    def __init__(self, base_url: str):
        self.base = base_url.rstrip("/")

    def _request(self, method: str, path: str, body: bytes | None = None, timeout_s: float = 10.0):
        req = urllib.request.Request(f"{self.base}/{path}", data=body, method=method, headers=HEADERS)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.read(), resp.headers.get("ETag", "")
        except urllib.error.HTTPError as err:
            if method == "DELETE" and err.code == 404:
                return b"", ""
            raise MetadataError(f"{method} {path}: {err.code} {err.reason}") from err
        except (urllib.error.URLError, OSError) as err:
            raise MetadataError(f"{method} {path}: {err}") from err

    async def attributes(self, last_etag: str, timeout_s: float) -> tuple[dict[str, str], str]:
        query = {"recursive": "true"}
        if last_etag:
            query |= {"wait_for_change": "true", "last_etag": last_etag, "timeout_sec": str(int(timeout_s))}
        path = "instance/attributes/?" + urllib.parse.urlencode(query)
        # The server holds a wait up to timeout_sec: the socket waits a little longer.
        raw, etag = await asyncio.to_thread(self._request, "GET", path, None, timeout_s + 10.0)
        return json.loads(raw or b"{}"), etag

    async def value(self, path: str, last_etag: str, timeout_s: float) -> tuple[str, str]:
        query = {"wait_for_change": "true", "last_etag": last_etag, "timeout_sec": str(int(timeout_s))} if last_etag else {}
        url = path + ("?" + urllib.parse.urlencode(query) if query else "")
        raw, etag = await asyncio.to_thread(self._request, "GET", url, None, timeout_s + 10.0)
        return raw.decode(), etag

    async def put_guest(self, key: str, value: str) -> None:
        await asyncio.to_thread(self._request, "PUT", f"instance/guest-attributes/{NAMESPACE}/{key}", value.encode())

    async def delete_guest(self, key: str) -> None:
        await asyncio.to_thread(self._request, "DELETE", f"instance/guest-attributes/{NAMESPACE}/{key}")

    async def access_token(self) -> str:
        return await asyncio.to_thread(self.access_token_now)

    def access_token_now(self) -> str:
        """The access token, read now (blocking): for callers outside an event loop."""
        raw, _ = self._request("GET", "instance/service-accounts/default/token")
        try:
            return str(json.loads(raw)["access_token"])
        except (ValueError, KeyError) as err:
            raise MetadataError(f"no access token in the metadata server's answer: {err}") from err
