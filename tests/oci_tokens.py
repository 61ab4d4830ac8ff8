"""A registry behind a token service, for tests of the Bearer flow (as Artifact Registry and
Docker Hub answer): the token service issues tokens for the right basic credentials, the registry
trusts them (tests/oci.py starts the registry itself)."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from oci import RegistryServer, wait_up
from provisioner.perf.fleet import free_port
from provisioner.security.pki import ensure_local_pki, local_files


# ---- a registry behind a token service (the Bearer flow, as Artifact Registry and Docker Hub) --

@dataclass
class TokenService:
    """Issues registry tokens at /token for the right basic credentials, as a registry's
    `auth: token` expects them: JWTs signed by a key whose certificate (in the `x5c` header)
    chains to the registry's root bundle, granting what the `scope` parameter asked for."""

    url: str
    issued: list[str]
    server: object

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


TOKEN_ISSUER, TOKEN_SERVICE = "provisioner-test-issuer", "provisioner-test-registry"


def start_token_service(tls_dir: Path, username: str, password: str) -> TokenService:
    import threading
    import uuid
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    import jwt
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    ensure_local_pki(tls_dir, {"registry-token": ["token.provisioner.test"]})
    files = local_files(tls_dir, "registry-token")
    key = files.key.read_bytes()
    chain = [base64.b64encode(x509.load_pem_x509_certificate(files.cert.read_bytes()).public_bytes(Encoding.DER))
             .decode()]
    want = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
    issued: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urlparse(self.path)
            query = parse_qs(url.query)
            if url.path != "/token" or self.headers.get("Authorization") != want:
                self.send_response(401)
                self.end_headers()
                return
            access = []
            for scope in query.get("scope", []):
                kind, name, actions = scope.split(":")
                access.append({"type": kind, "name": name, "actions": [a for a in actions.split(",") if a == "pull"]})
            now = int(time.time())
            token = jwt.encode({"iss": TOKEN_ISSUER, "sub": username, "aud": query.get("service", [""])[0],
                                "iat": now, "nbf": now - 10, "exp": now + 300, "jti": uuid.uuid4().hex,
                                "access": access}, key, algorithm="ES256", headers={"x5c": chain})
            issued.append(",".join(query.get("scope", [])))
            body = json.dumps({"token": token, "expires_in": 300}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return TokenService(f"http://127.0.0.1:{server.server_address[1]}/token", issued, server)


def start_token_registry(root: Path, storage: RegistryServer) -> tuple[RegistryServer, TokenService]:
    """A second registry over `storage`'s files (what was pushed there), demanding tokens from a
    token service that takes `storage`'s credentials."""
    root.mkdir(parents=True, exist_ok=True)
    tokens = start_token_service(storage.root / "tls", storage.username, storage.password)
    files = local_files(storage.root / "tls", "registry")
    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(storage.root / "data")}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "test-only-secret",
                 "tls": {"certificate": str(files.cert), "key": str(files.key)}},
        "auth": {"token": {"realm": tokens.url, "service": TOKEN_SERVICE, "issuer": TOKEN_ISSUER,
                           "rootcertbundle": str(storage.ca_file)}},
    }
    (root / "config.yml").write_text(json.dumps(config))
    log = root / "registry.log"
    out = open(log, "ab")
    process = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=out, stderr=out)
    out.close()
    server = RegistryServer(f"127.0.0.1:{port}", storage.ca_file, storage.username, storage.password, log,
                            process, root)
    try:
        wait_up(server)
    except RuntimeError:
        tokens.stop()
        raise
    return server, tokens
