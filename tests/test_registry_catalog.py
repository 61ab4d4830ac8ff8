"""The registry is the catalog: the client and RegistryCatalog against a real docker-registry
(TLS from a throwaway CA, htpasswd authentication), images built and pushed by tests/oci.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from oci import Blob, build_image, push_image, push_versions, registry  # noqa: F401 (fixture)
from oci_tokens import start_token_registry
from prometheus_client import generate_latest

from provisioner.observability.metrics import Metrics
from provisioner.registry.catalog import CatalogFeed, RegistryCatalog, natural_key
from provisioner.registry.client import OCI_INDEX, RegistryClient, RegistryError


def client_for(server, password: str | None = None, **kwargs) -> RegistryClient:
    creds = (server.username, server.password if password is None else password)
    return RegistryClient(server.url, ca_file=str(server.ca_file), credentials=lambda: creds, **kwargs)


def test_three_versions_with_their_digests_and_shared_layers(registry):
    images = push_versions(registry)
    catalog = RegistryCatalog(client_for(registry), "nb").fetch()
    assert catalog.versions() == ("nb:v1", "nb:v2", "nb:v3")
    assert catalog.latest == "nb:v3"
    assert catalog.repository == f"{registry.host}/nb"  # what agents pull `@digest` from
    for tag, image in images.items():
        assert catalog.digest(f"nb:{tag}") == image.digest
        assert [(layer.id, layer.size_bytes) for layer in catalog.layers(f"nb:{tag}")] == \
            [(b.digest, len(b.data)) for b in image.layers]
    # Consecutive versions share their lower layers, by digest: a VM holding v1 lacks only v2's page.
    v1_layers = catalog.layer_ids("nb:v1")
    assert catalog.missing_bytes("nb:v2", v1_layers) == len(images["v2"].layers[2].data)
    assert catalog.resolve("nb:latest") == "nb:v3"


def test_pagination_and_natural_order(registry):
    tags = ("v9", "v10", "v2", "v1")
    push_versions(registry, versions=tags)
    client = client_for(registry, page_size=2)
    assert sorted(client.tags("nb")) == sorted(tags)
    assert RegistryCatalog(client, "nb").fetch().versions() == ("nb:v1", "nb:v2", "nb:v9", "nb:v10")
    assert sorted(["v10", "v9", "v100", "v1a", "v1"], key=natural_key) == ["v1", "v1a", "v9", "v10", "v100"]


def test_latest_is_a_tag_or_configured(registry):
    images = push_versions(registry)
    push_image(registry, "nb", "latest", images["v2"])
    assert RegistryCatalog(client_for(registry), "nb").fetch().latest == "nb:v2"
    assert RegistryCatalog(client_for(registry), "nb", latest="v1").fetch().latest == "nb:v1"
    with pytest.raises(ValueError, match="v7"):
        RegistryCatalog(client_for(registry), "nb", latest="v7").fetch()


def test_docker_v2_manifests_and_image_indexes(registry):
    docker = build_image("nb:v1", docker_format=True)
    push_image(registry, "nb", "v1", docker)
    oci = build_image("nb:v2")
    other = build_image("nb:v2", page="another platform")
    push_image(registry, "nb", "v2-amd64", oci)
    push_image(registry, "nb", "v2-arm64", other)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {**other.manifest.descriptor(), "platform": {"os": "linux", "architecture": "arm64"}},
        {**oci.manifest.descriptor(), "platform": {"os": "linux", "architecture": "amd64"}}]}
    index_blob = Blob(OCI_INDEX, json.dumps(index).encode())
    status, _, body = registry.request("PUT", "/v2/nb/manifests/v2", index_blob.data, {"Content-Type": OCI_INDEX})
    assert status == 201, body
    client = client_for(registry)
    assert client.manifest("nb", "v1").layers == tuple((b.digest, len(b.data)) for b in docker.layers)
    m = client.manifest("nb", "v2")
    assert m.digest == index_blob.digest == "sha256:" + hashlib.sha256(index_blob.data).hexdigest()
    assert m.layers == tuple((b.digest, len(b.data)) for b in oci.layers)
    assert client.digest("nb", "v2") == index_blob.digest


def test_wrong_or_missing_credentials_are_permanent_errors(registry):
    push_versions(registry, versions=("v1",))
    with pytest.raises(RegistryError) as e:
        client_for(registry, password="wrong").tags("nb")
    assert e.value.status == 401 and not e.value.retryable
    with pytest.raises(RegistryError, match="none are configured"):
        RegistryClient(registry.url, ca_file=str(registry.ca_file)).tags("nb")
    with pytest.raises(RegistryError) as e:
        client_for(registry).manifest("nb", "v9")
    assert e.value.status == 404 and not e.value.retryable


async def test_a_refresh_picks_up_new_tags_and_repushes_and_a_failed_one_keeps_the_last_good(registry):
    images = push_versions(registry)
    source = RegistryCatalog(client_for(registry), "nb")
    feed = CatalogFeed(source.fetch(), source.fetch, source="test")
    metrics = Metrics()
    metrics.watch_catalog(feed)
    heard = []
    feed.subscribe(heard.append)
    assert not await feed.refresh() and feed.refreshes["unchanged"] == 1

    push_versions(registry, versions=("v4",))
    assert await feed.refresh()
    assert heard[-1] is feed.current and feed.current.versions()[-1] == "nb:v4"
    assert feed.current.latest == "nb:v4"

    v2_before = feed.current.digest("nb:v2")
    rebuilt = build_image("nb:v2", page="v2, rebuilt")
    push_image(registry, "nb", "v2", rebuilt)
    assert await feed.refresh()
    assert v2_before == images["v2"].digest != feed.current.digest("nb:v2") == rebuilt.digest

    good = feed.current
    registry.stop()
    assert not await feed.refresh()
    assert feed.current is good and feed.refreshes["failed"] == 1 and feed.last_error
    assert len(heard) == 2
    scraped = generate_latest(metrics.registry).decode()
    assert 'provisioner_image_catalog_refreshes_total{outcome="failed"} 1.0' in scraped
    assert 'provisioner_image_catalog_refreshes_total{outcome="changed"} 2.0' in scraped
    assert "provisioner_image_catalog_versions 4.0" in scraped


def test_the_bearer_token_flow(registry, tmp_path):
    images = push_versions(registry)
    server, tokens = start_token_registry(tmp_path / "token-registry", registry)
    try:
        status, headers, _ = server.request("GET", "/v2/nb/tags/list", auth=False)
        assert status == 401 and headers["Www-Authenticate"].startswith("Bearer ")
        catalog = RegistryCatalog(client_for(server), "nb").fetch()
        assert [catalog.digest(f"nb:{t}") for t in ("v1", "v2", "v3")] == [images[t].digest for t in ("v1", "v2", "v3")]
        # One token for the repository, used for every call after it.
        assert tokens.issued == ["repository:nb:pull"]
        with pytest.raises(RegistryError) as e:
            client_for(server, password="wrong").tags("nb")
        assert e.value.status == 401 and not e.value.retryable
    finally:
        server.stop()
        tokens.stop()


def test_on_a_vm_the_registry_is_asked_with_the_service_accounts_access_token(tmp_path):
    """`auth: {kind: gce_metadata}`: the user is `oauth2accesstoken` and the password the token the
    metadata server gives, read when the registry challenges (as Artifact Registry takes it)."""
    from fake_compute import FakeCompute
    from fake_metadata import FakeMetadataServer
    from oci import require_tools, start_registry
    from provisioner.config.registry import RegistryAuthConfig, RegistryImagesConfig
    from provisioner.registry.source import ACCESS_TOKEN_USER, registry_catalog

    require_tools()
    token = "ya29.a-token-of-the-vms-service-account"
    server = start_registry(tmp_path / "registry", username=ACCESS_TOKEN_USER, password=token)
    metadata = FakeMetadataServer(FakeCompute(), "p", "vm").start()
    try:
        images = push_versions(server)
        cfg = RegistryImagesConfig(url=server.url, repository="nb", ca_file=str(server.ca_file),
                                   auth=RegistryAuthConfig(kind="gce_metadata", metadata_url=metadata.url))
        with pytest.raises(RegistryError):  # no token to be had: the registry is not asked blind
            registry_catalog(cfg).fetch()
        metadata.access_token = token
        catalog = registry_catalog(cfg).fetch()
        assert catalog.digest("nb:v2") == images["v2"].digest
        assert ("GET", "/computeMetadata/v1/instance/service-accounts/default/token") in metadata.requests
    finally:
        metadata.stop()
        server.stop()
