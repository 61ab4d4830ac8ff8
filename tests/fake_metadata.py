"""A fake of one VM's metadata server, over real HTTP on loopback, backed by that instance in
FakeCompute (what the Compute API sets, the VM reads; what the VM writes, the API reads).

As the GCE metadata server answers: every request must carry `Metadata-Flavor: Google` (else
403) and every answer does too; `instance/attributes/?recursive=true` is the instance's custom
metadata as JSON with an ETag; with `wait_for_change=true&last_etag=E` the answer waits until the
metadata differs from E or `timeout_sec` passes; guest attributes are PUT, read and DELETEd under
`instance/guest-attributes/<namespace>/<key>`, and refused (403) unless `enable-guest-attributes`
is TRUE in the instance's or the project's metadata, and writes (PUT, DELETE) beyond about 10 a
minute are dropped without an error (answered 200, not kept), as Compute Engine documents it may.
`instance/maintenance-event` (NONE, MIGRATE_ON_HOST_MAINTENANCE, TERMINATE_ON_HOST_MAINTENANCE)
and `instance/preempted` (FALSE, TRUE) are the instance's, with wait-for-change as for attributes.
"""

from __future__ import annotations

import hashlib
import json
import time
from urllib.parse import parse_qs, urlparse

from fake_compute import FakeCompute
from fake_http import FakeHttpServer

PREFIX = "/computeMetadata/v1/"


class FakeMetadataServer:
    def __init__(self, compute: FakeCompute, project: str, name: str, project_metadata: dict[str, str] | None = None,
                 writes_per_minute: int = 10):
        self.compute, self.key = compute, (project, name)
        self.project_metadata = project_metadata or {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.writes_per_minute = writes_per_minute
        self.identity: FakeIdentity | None = None  # the service account's ID tokens, when set
        self.access_token: str | None = None  # the service account's OAuth access token, when set
        self.written_at: list[float] = []  # wall times of the guest attribute writes kept
        self.dropped: list[tuple[str, str]] = []  # (method, key) of those dropped
        self._http = FakeHttpServer(self._answer, ("GET", "PUT", "DELETE"))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.port}{PREFIX.rstrip('/')}"

    def start(self) -> FakeMetadataServer:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()
        with self.compute.metadata_changed:
            self.compute.metadata_changed.notify_all()

    # ---- under the compute lock ------------------------------------------------------------

    def _instance(self):
        return self.compute.instances.get(self.key)

    def _attributes(self) -> tuple[dict[str, str], str]:
        inst = self._instance()
        items = inst.body.get("metadata", {}).get("items", []) if inst else []
        attrs = {i["key"]: i.get("value", "") for i in items}
        etag = hashlib.sha1(json.dumps(attrs, sort_keys=True).encode()).hexdigest()[:16]
        return attrs, etag

    def _held(self, query: dict[str, str], read):
        """`read()` (a value and its ETag), held with wait_for_change until the ETag differs from
        last_etag, timeout_sec passes or the instance goes (under the compute lock)."""
        value, etag = read()
        if query.get("wait_for_change") == "true":
            deadline = time.monotonic() + float(query.get("timeout_sec", "60"))
            while etag == query.get("last_etag") and self._instance() is not None:
                if (left := deadline - time.monotonic()) <= 0:
                    break
                self.compute.metadata_changed.wait(left)
                if self._instance() is not None:
                    value, etag = read()
        return value, etag

    def _value(self, path: str) -> tuple[str, str]:
        inst = self._instance()
        value = inst.maintenance_event if path == "instance/maintenance-event" else inst.preempted
        return value, hashlib.sha1(value.encode()).hexdigest()[:16]

    def _rate_allows(self) -> bool:
        now = time.monotonic()
        self.written_at = [t for t in self.written_at if t > now - 60.0]
        if len(self.written_at) >= self.writes_per_minute:
            return False
        self.written_at.append(now)
        return True

    def _guest_enabled(self) -> bool:
        attrs, _ = self._attributes()
        value = attrs.get("enable-guest-attributes", self.project_metadata.get("enable-guest-attributes", ""))
        return value.upper() == "TRUE"

    def handle(self, method: str, raw_path: str, headers, body: bytes) -> tuple[int, bytes, dict]:
        url = urlparse(raw_path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.requests.append((method, url.path))
        if headers.get("Metadata-Flavor") != "Google":
            return 403, b"Missing Metadata-Flavor:Google header.", {}
        if not url.path.startswith(PREFIX):
            return 404, b"not found", {}
        path = url.path[len(PREFIX):]
        if path == "instance/service-accounts/default/identity" and self.identity is not None:
            status, token = self.identity.token(query)
            return status, token, {}
        if path == "instance/service-accounts/default/token" and self.access_token is not None:
            # As Google answers: the token, its lifetime in seconds and its type, as JSON.
            return 200, json.dumps({"access_token": self.access_token, "expires_in": 3599,
                                    "token_type": "Bearer"}).encode(), {"Content-Type": "application/json"}
        cond = self.compute.metadata_changed
        with cond:
            if self._instance() is None:
                return 503, b"the instance is gone", {}
            if path == "instance/attributes/" and method == "GET":
                attrs, etag = self._held(query, self._attributes)
                return 200, json.dumps(attrs).encode(), {"ETag": etag, "Content-Type": "application/json"}
            if path in ("instance/maintenance-event", "instance/preempted") and method == "GET":
                value, etag = self._held(query, lambda: self._value(path))
                return 200, value.encode(), {"ETag": etag}
            if path.startswith("instance/guest-attributes/"):
                parts = path[len("instance/guest-attributes/"):].split("/")
                if len(parts) != 2 or not all(parts):
                    return 400, b"namespace/key expected", {}
                if not self._guest_enabled():
                    return 403, b"Guest attributes endpoint access is disabled.", {}
                namespace, key = parts
                guest = self._instance().guest
                if namespace != "provisioner":
                    return 404, b"not found", {}
                if method in ("PUT", "DELETE") and not self._rate_allows():
                    self.dropped.append((method, key))
                    return 200, b"", {}
                if method == "PUT":
                    guest[key] = body.decode()
                    return 200, b"", {}
                if method == "DELETE":
                    guest.pop(key, None)
                    return 200, b"", {}
                if method == "GET":
                    return (200, guest[key].encode(), {}) if key in guest else (404, b"not found", {})
            return 404, b"not found", {}

    def _answer(self, method: str, path: str, headers, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        status, out, extra = self.handle(method, path, headers, body)
        return status, out, {"Metadata-Flavor": "Google", **extra}


class FakeIdentity:
    """The metadata server's identity endpoint
    (`instance/service-accounts/default/identity?audience=A&format=F`) as Google documents it: an
    RS256 ID token for the audience, with `email`, `email_verified` and the instance's details
    (`google.compute_engine`) only when `format=full`. Google writes its issuer either way
    (`https://accounts.google.com` or `accounts.google.com`)."""

    def __init__(self, email: str, issuer: str = "https://accounts.google.com", instance: dict | None = None):
        from cryptography.hazmat.primitives.asymmetric import rsa

        self.email, self.issuer = email, issuer
        # project_id, project_number, zone, instance_id, instance_name, instance_creation_timestamp
        self.instance = instance or {}
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.formats: list[str] = []  # the format each request asked for

    def token(self, query: dict[str, str]) -> tuple[int, bytes]:
        import jwt

        if not query.get("audience"):
            return 400, b"non-empty audience parameter required"
        self.formats.append(query.get("format", "standard"))
        now = int(time.time())
        claims = {"iss": self.issuer, "aud": query["audience"], "azp": "1234567890", "sub": "1234567890",
                  "iat": now, "exp": now + 3600}
        if query.get("format") == "full":
            claims |= {"email": self.email, "email_verified": True,
                       "google": {"compute_engine": dict(self.instance)}}
        return 200, jwt.encode(claims, self.key, algorithm="RS256").encode()
