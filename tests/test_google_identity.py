"""Google ID tokens from the metadata server, as Google documents them: `email` only with
`format=full`, and the issuer spelled with or without `https://`. The client asks for the full
format; the front accepts both spellings of the issuer it trusts."""

from __future__ import annotations

import jwt
import pytest

from fake_compute import FakeCompute
from fake_metadata import FakeIdentity, FakeMetadataServer
from provisioner.client import credentials
from provisioner.client.google_identity import id_token
from provisioner.model.errors import Unauthenticated
from provisioner.security.tokens import Issuer, TokenVerifier

PROJECT, VM = "test-proj", "vm-1"
ACCOUNT = "notebook-backend@test-proj.iam.gserviceaccount.com"
AUDIENCE = "https://provisioner.example.com"


@pytest.fixture
def metadata():
    compute = FakeCompute().start()
    compute.plant(PROJECT, "us-central1-f", VM, {})
    server = FakeMetadataServer(compute, PROJECT, VM).start()
    server.identity = FakeIdentity(ACCOUNT, instance={
        "project_id": PROJECT, "project_number": 1234567890, "zone": "us-central1-f", "instance_id": "5551234",
        "instance_name": VM, "instance_creation_timestamp": 1795000000})
    yield server
    server.stop()
    compute.stop()


def verifier(identity: FakeIdentity, issuer: str = "https://accounts.google.com") -> TokenVerifier:
    return TokenVerifier([Issuer(issuer, AUDIENCE, "email", frozenset({"user"}), {ACCOUNT: frozenset({"service"})},
                                 public_key=identity.key.public_key())])


def test_the_client_asks_for_the_full_token_and_the_front_names_its_service_account(metadata, monkeypatch):
    monkeypatch.setenv("PROVISIONER_ID_TOKEN_AUDIENCE", AUDIENCE)
    monkeypatch.delenv("PROVISIONER_TOKEN", raising=False)
    monkeypatch.delenv("PROVISIONER_TOKEN_FILE", raising=False)
    monkeypatch.setenv("GCE_METADATA_HOST", metadata.url.split("/")[2])
    token = credentials.resolve(data_dir="/nonexistent").token
    assert metadata.identity.formats == ["full"]
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["email"] == ACCOUNT and claims["google"]["compute_engine"]["instance_name"] == VM
    caller = verifier(metadata.identity).verify(token)
    assert caller.identity == ACCOUNT and caller.roles == frozenset({"service"})


@pytest.mark.parametrize("spelling", ["https://accounts.google.com", "accounts.google.com"])
@pytest.mark.parametrize("trusted", ["https://accounts.google.com", "accounts.google.com"])
def test_either_spelling_of_google_s_issuer_is_google(metadata, spelling, trusted):
    metadata.identity.issuer = spelling
    token = id_token(AUDIENCE, metadata.url)
    assert verifier(metadata.identity, trusted).verify(token).identity == ACCOUNT


def test_a_token_without_the_full_format_has_no_email_and_is_refused(metadata):
    import urllib.request
    req = urllib.request.Request(f"{metadata.url}/instance/service-accounts/default/identity?audience={AUDIENCE}",
                                 headers={"Metadata-Flavor": "Google"})
    token = urllib.request.urlopen(req, timeout=10).read().decode()
    assert "email" not in jwt.decode(token, options={"verify_signature": False})
    with pytest.raises(Unauthenticated, match="no 'email' claim"):
        verifier(metadata.identity).verify(token)
