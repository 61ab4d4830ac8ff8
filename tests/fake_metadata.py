"""A fake of one VM's metadata server, over real HTTP on loopback, backed by that instance in
FakeCompute (what the Compute API sets, the VM reads; what the VM writes, the API reads).

As the GCE metadata server answers: every request must carry `Metadata-Flavor: Google` (else
403) and every answer does too; `instance/attributes/?recursive=true` is the instance's custom
metadata as JSON with an ETag; with `wait_for_change=true&last_etag=E` the answer waits until the
metadata differs from E or `timeout_sec` passes; guest attributes are PUT, read and DELETEd under
`instance/guest-attributes/<namespace>/<key>`, and refused (403) unless `enable-guest-attributes`
is TRUE in the instance's or the project's metadata.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from fake_compute import FakeCompute

PREFIX = "/computeMetadata/v1/"


class FakeMetadataServer:
    def __init__(self, compute: FakeCompute, project: str, name: str, project_metadata: dict[str, str] | None = None):
        self.compute, self.key = compute, (project, name)
        self.project_metadata = project_metadata or {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{PREFIX.rstrip('/')}"

    def start(self) -> FakeMetadataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
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
        cond = self.compute.metadata_changed
        with cond:
            if self._instance() is None:
                return 503, b"the instance is gone", {}
            if path == "instance/attributes/" and method == "GET":
                attrs, etag = self._attributes()
                if query.get("wait_for_change") == "true":
                    deadline = time.monotonic() + float(query.get("timeout_sec", "60"))
                    while etag == query.get("last_etag") and self._instance() is not None:
                        if (left := deadline - time.monotonic()) <= 0:
                            break
                        cond.wait(left)
                        attrs, etag = self._attributes()
                return 200, json.dumps(attrs).encode(), {"ETag": etag, "Content-Type": "application/json"}
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
                if method == "PUT":
                    guest[key] = body.decode()
                    return 200, b"", {}
                if method == "DELETE":
                    guest.pop(key, None)
                    return 200, b"", {}
                if method == "GET":
                    return (200, guest[key].encode(), {}) if key in guest else (404, b"not found", {})
            return 404, b"not found", {}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, out, extra = fake.handle(method, self.path, self.headers, body)
                try:
                    self.send_response(status)
                    self.send_header("Metadata-Flavor", "Google")
                    for k, v in extra.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):
                self._serve("GET")

            def do_PUT(self):
                self._serve("PUT")

            def do_DELETE(self):
                self._serve("DELETE")

            def log_message(self, *args):
                pass

        return Handler
