"""A small, read-only client of the Docker Registry HTTP API v2 (as Artifact Registry, Docker Hub
and the CNCF distribution registry serve it): tags, manifests and their digests. Blocking; the
catalog calls it off the event loop.

Authentication follows the registry's `WWW-Authenticate` challenge on a 401: `Basic` sends the
credentials with every request; `Bearer` trades them at the challenge's realm for a token scoped
to the repository (`repository:<name>:pull`), as Artifact Registry wants with the user name
`oauth2accesstoken` and a service account's access token from the metadata server as password.
Errors are RegistryError, never urllib's.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Callable

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
PLATFORM = ("linux", "amd64")  # the VMs' platform, picked from an image index

Credentials = Callable[[], "tuple[str, str] | None"]  # (user, password) now, or None: anonymous


class RegistryError(Exception):
    """The registry could not answer as asked. `retryable`: a later try may succeed."""

    def __init__(self, message: str, retryable: bool = True, status: int = 0):
        super().__init__(message)
        self.retryable = retryable
        self.status = status


@dataclass(frozen=True, slots=True)
class Manifest:
    """An image as a tag or digest names it: `digest` is the manifest's (an index's, for a
    multi-platform image); the layers are those of the VMs' platform, bottom first."""

    digest: str
    media_type: str
    layers: tuple[tuple[str, int], ...]  # (digest, size in bytes)


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """('bearer' or 'basic', its parameters) of a WWW-Authenticate header."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


def next_page(link: str | None) -> str | None:
    """The path of a `Link: </v2/...?n=..&last=..>; rel="next"` header, if any."""
    if link and (m := re.search(r'<([^>]+)>\s*;\s*rel="?next"?', link)):
        return m.group(1)
    return None


def content_digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class RegistryClient:
    def __init__(self, url: str, *, ca_file: str | None = None, credentials: Credentials | None = None,
                 timeout_s: float = 30.0, page_size: int = 1000):
        self.url = url.rstrip("/")
        self._ssl = ssl.create_default_context(cafile=ca_file) if url.startswith("https") else None
        self._credentials = credentials or (lambda: None)
        self._timeout_s = timeout_s
        self._page_size = page_size
        self._auth: dict[str, str] = {}  # scope -> Authorization header that worked

    # ---- the API ---------------------------------------------------------------------------

    def tags(self, repository: str) -> list[str]:
        """Every tag of the repository, following the registry's pagination."""
        tags: list[str] = []
        path: str | None = f"/v2/{repository}/tags/list?n={self._page_size}"
        while path:
            _, headers, body = self._call("GET", path, repository)
            tags.extend(_json(body, path).get("tags") or ())
            path = next_page(headers.get("Link"))
        return tags

    def digest(self, repository: str, reference: str) -> str:
        """The manifest digest a tag names now (HEAD: no body moves)."""
        _, headers, _ = self._call("HEAD", f"/v2/{repository}/manifests/{reference}", repository,
                                   {"Accept": ", ".join(MANIFEST_TYPES)})
        digest = headers.get("Docker-Content-Digest")
        if not digest:
            raise RegistryError(f"{repository}:{reference}: the registry named no Docker-Content-Digest", False)
        return digest

    def manifest(self, repository: str, reference: str) -> Manifest:
        """The manifest of a tag or digest; for an index, the layers of the platform's manifest."""
        media_type, body, digest = self._manifest(repository, reference)
        top_digest = digest
        if media_type in INDEX_TYPES:
            choice = _platform_manifest(_json(body, reference), f"{repository}:{reference}")
            media_type, body, digest = self._manifest(repository, choice)
        doc = _json(body, reference)
        layers = tuple((layer["digest"], int(layer["size"])) for layer in doc.get("layers") or ())
        if not layers:
            raise RegistryError(f"{repository}@{digest}: a manifest without layers ({media_type})", False)
        return Manifest(top_digest, media_type, layers)

    # ---- plumbing --------------------------------------------------------------------------

    def _manifest(self, repository: str, reference: str) -> tuple[str, bytes, str]:
        _, headers, body = self._call("GET", f"/v2/{repository}/manifests/{reference}", repository,
                                      {"Accept": ", ".join(MANIFEST_TYPES)})
        digest = content_digest(body)
        named = headers.get("Docker-Content-Digest")
        if (named and named != digest) or (reference.startswith("sha256:") and reference != digest):
            raise RegistryError(f"{repository}:{reference}: manifest digest {digest} is not the one named "
                                f"({named or reference})", False)
        media_type = headers.get("Content-Type", "").split(";")[0].strip()
        media_type = media_type or _json(body, reference).get("mediaType", "")
        return media_type, body, digest

    def _call(self, method: str, path: str, repository: str, headers: dict[str, str] | None = None):
        scope = f"repository:{repository}:pull"
        auth = self._auth.get(scope)
        status, out_headers, body = self._send(method, path, headers, auth)
        if status == 401:
            self._auth[scope] = auth = self._answer(out_headers.get("WWW-Authenticate", ""), scope)
            status, out_headers, body = self._send(method, path, headers, auth)
        if status >= 400:
            raise RegistryError(f"{method} {path}: {status} {_error_text(body)}", retryable=status in (408, 429)
                                or status >= 500, status=status)
        return status, out_headers, body

    def _send(self, method: str, path: str, headers: dict[str, str] | None, auth: str | None,
              url: str | None = None):
        req = urllib.request.Request(url or self.url + path, method=method, headers=dict(headers or {}))
        if auth:
            req.add_header("Authorization", auth)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=self._timeout_s) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()
        except (urllib.error.URLError, OSError) as e:
            raise RegistryError(f"{method} {url or self.url + path}: {getattr(e, 'reason', e)}") from e

    def _answer(self, challenge: str, scope: str) -> str:
        """The Authorization header that answers the registry's challenge."""
        scheme, params = parse_challenge(challenge)
        creds = self._credentials()
        basic = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode() if creds else None
        if scheme == "basic":
            if basic is None:
                raise RegistryError("the registry wants credentials and none are configured", False, 401)
            return basic
        if scheme != "bearer" or "realm" not in params:
            raise RegistryError(f"unsupported authentication challenge {challenge!r}", False, 401)
        query = {"service": params.get("service", ""), "scope": params.get("scope", scope)}
        url = params["realm"] + ("&" if "?" in params["realm"] else "?") + urllib.parse.urlencode(query)
        status, _, body = self._send("GET", "", None, basic, url=url)
        if status != 200:
            raise RegistryError(f"the token service {params['realm']} answered {status} {_error_text(body)}",
                                retryable=status >= 500 or status == 429, status=status)
        doc = _json(body, "token")
        token = doc.get("token") or doc.get("access_token")
        if not token:
            raise RegistryError(f"the token service {params['realm']} gave no token", False)
        return f"Bearer {token}"


def _platform_manifest(index: dict, name: str) -> str:
    for m in index.get("manifests") or ():
        p = m.get("platform") or {}
        if (p.get("os"), p.get("architecture")) == PLATFORM:
            return m["digest"]
    raise RegistryError(f"{name}: the image index has no {'/'.join(PLATFORM)} manifest", False)


def _json(body: bytes, what: str) -> dict:
    try:
        doc = json.loads(body)
    except ValueError:
        raise RegistryError(f"{what}: the registry's answer is not JSON", False) from None
    if not isinstance(doc, dict):
        raise RegistryError(f"{what}: the registry's answer is not a JSON object", False)
    return doc


def _error_text(body: bytes) -> str:
    try:
        errors = json.loads(body).get("errors") or ()
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or body[:200].decode(errors="replace")
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")
