"""TLS material: the files a process serves and dials with, and a throwaway local CA.

In production the CA, certificates and keys come from files named by flags or the environment
(on GKE: mounted secrets). The local fleet has none of that, so `up` (and `serve` without TLS
flags) makes a CA of its own under the data dir and issues one certificate per process. The CA
key never leaves that directory; delete it to start afresh.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from provisioner.common.private_files import open_private

CA_CERT, CA_KEY = "ca.pem", "ca-key.pem"
CA_DAYS, LEAF_DAYS = 365, 90
RENEW_BEFORE = datetime.timedelta(days=7)  # a leaf this close to expiry is reissued at start
LOOPBACK_IP = ipaddress.ip_address("127.0.0.1")


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA that signs the fleet's certificates, and this process's own pair."""

    ca: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(ca, cert chain, key), read now: servers call this again to pick up rotated files."""
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()

    def mtime(self) -> float:
        return max(p.stat().st_mtime for p in (self.ca, self.cert, self.key))


def local_files(directory: Path, name: str) -> TlsFiles:
    return TlsFiles(directory / CA_CERT, directory / f"{name}.pem", directory / f"{name}-key.pem")


def ensure_local_pki(directory: Path, leaves: dict[str, list[str]]) -> None:
    """Makes the local CA (once) and a certificate for each `name -> DNS names` (each also valid
    for 127.0.0.1 and localhost), reissuing one whose names changed or that is near expiry.
    Processes sharing the directory may call this at once: a file lock serializes them."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    with locked(directory / ".lock"):
        ca_cert, ca_key = _ca(directory)
        for name, dns in leaves.items():
            files = local_files(directory, name)
            wanted = sorted({*dns, "localhost"})
            if not _current(files.cert, wanted):
                _issue(files, name, wanted, ca_cert, ca_key)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    with open_private(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _now() -> datetime.datetime:
    # Certificate validity is about the wall clock of every peer, not the fleet's model clock.
    return datetime.datetime.now(datetime.timezone.utc)


def _ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if cert_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        if cert.not_valid_after_utc - _now() > RENEW_BEFORE:
            return cert, serialization.load_pem_private_key(key_path.read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "provisioner local CA")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(minutes=5))
            .not_valid_after(_now() + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    write_file(key_path, key_pem(key), private=True)
    write_file(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    # A new CA invalidates every leaf it did not sign.
    for leaf in directory.glob("*.pem"):
        if leaf.name not in (CA_CERT, CA_KEY):
            leaf.unlink()
    return cert, key


def _current(cert_path: Path, dns: list[str]) -> bool:
    if not cert_path.exists():
        return False
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} - {str(LOOPBACK_IP)}
    return sorted([*san.get_values_for_type(x509.DNSName), *ips]) == sorted(
        n for n in dns if n != str(LOOPBACK_IP)) and cert.not_valid_after_utc - _now() > RENEW_BEFORE


def _san_entry(name: str) -> x509.GeneralName:
    """An IP address as an IP entry (what a client dialling it checks), anything else as a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _issue(files: TlsFiles, name: str, dns: list[str], ca_cert: x509.Certificate,
           ca_key: ec.EllipticCurvePrivateKey) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([*(_san_entry(d) for d in dns if d != str(LOOPBACK_IP)),
                                       x509.IPAddress(LOOPBACK_IP)])
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[0] if dns else name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(minutes=5))
            .not_valid_after(_now() + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(san, critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # Every process both serves and dials (the front is the clusters' client).
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    write_file(files.key, key_pem(key), private=True)
    write_file(files.cert, cert.public_bytes(serialization.Encoding.PEM))


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write_file(path: Path, data: bytes, private: bool = False) -> None:
    """Atomically (a reader never sees half a file), keys readable by the owner only."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
