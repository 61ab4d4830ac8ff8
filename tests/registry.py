"""A real registry for tests: Debian's `docker-registry` (the CNCF distribution) on loopback, with
TLS from a CA made here and htpasswd authentication, logging every request (its access log tells
which blobs were fetched)."""

from __future__ import annotations

import crypt  # bcrypt for htpasswd; deprecated, still in the Pythons the project supports
import datetime
import ipaddress
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

USER, PASSWORD = "puller", "pull-secret"


@dataclass
class Registry:
    root: Path
    port: int
    process: subprocess.Popen

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.pem"

    def blob_fetches(self) -> list[str]:
        """The digests of the blobs fetched (GET), in order, from the access log."""
        out = []
        for line in (self.root / "registry.log").read_text(errors="replace").splitlines():
            if '"GET /v2/' in line and "/blobs/sha256:" in line:
                out.append("sha256:" + line.split("/blobs/sha256:", 1)[1][:64])
        return out

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def _tls(root: Path) -> None:
    """A CA (ca.pem) and the registry's certificate for 127.0.0.1 signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject: str, key, issuer, issuer_key, ca: bool) -> x509.Certificate:
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test registry CA")])
    ca = cert("test registry CA", ca_key, ca_name, ca_key, True)
    pem = serialization.Encoding.PEM
    (root / "ca.pem").write_bytes(ca.public_bytes(pem))
    (root / "cert.pem").write_bytes(cert("127.0.0.1", key, ca_name, ca_key, False).public_bytes(pem))
    (root / "key.pem").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))


def start_registry() -> Registry:
    """Starts docker-registry on a free loopback port; raises RuntimeError saying why it cannot."""
    if not shutil.which("docker-registry"):
        raise RuntimeError("docker-registry not found on PATH (apt-get install docker-registry)")
    root = Path(tempfile.mkdtemp(prefix="provisioner-registry-"))
    _tls(root)
    (root / "htpasswd").write_text(f"{USER}:{crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {
        "version": 0.1, "log": {"level": "info", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
        "auth": {"htpasswd": {"realm": "test", "path": str(root / "htpasswd")}},
        "http": {"addr": f"127.0.0.1:{port}", "tls": {"certificate": str(root / "cert.pem"),
                                                      "key": str(root / "key.pem")}},
    }
    (root / "config.yml").write_text(yaml.safe_dump(config))
    log = open(root / "registry.log", "wb")  # the access log goes to stdout, the rest to stderr
    process = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=log, stderr=log)
    deadline = time.monotonic() + 20  # wall clock: a real process starting
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return Registry(root, port, process)
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("docker-registry did not start: "
                                   + (root / "registry.log").read_text(errors="replace")[-500:]) from None
            time.sleep(0.05)
