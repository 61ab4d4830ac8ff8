"""Where the fleet's images come from: the `registry:` section of clusters/images.yaml, the
credentials it names, and the catalog feed a process starts with.

  registry:
    url: https://us-docker.pkg.dev          # the registry's base URL
    repository: my-project/notebooks/gpu    # the image family: its tags are the versions
    name: gpu                               # what users call it (gpu:v154); default: the last part
    latest: ""                              # a tag; "": the version a `latest` tag names, else the newest
    refresh_s: 300                          # new tags are picked up this often (wall seconds)
    ca_file: null                           # PEM bundle to trust instead of the system's
    auth: {kind: gce_metadata}              # none | basic (username, password_file) | gce_metadata

Relative file names are relative to the clusters directory. `gce_metadata` asks the metadata
server for the VM's service account's access token (as Artifact Registry wants, user name
`oauth2accesstoken`) whenever the registry challenges.
"""

from __future__ import annotations

from pathlib import Path

from provisioner.agent.metadata import HttpMetadata, MetadataError
from provisioner.common.clock import Clock
from provisioner.config.registry import RegistryAuthConfig, RegistryImagesConfig
from provisioner.registry.catalog import CatalogFeed, RegistryCatalog
from provisioner.registry.client import Credentials, RegistryClient, RegistryError

ACCESS_TOKEN_USER = "oauth2accesstoken"


def credentials(auth: RegistryAuthConfig) -> Credentials:
    """What the client presents when challenged, read at that moment (rotated files and expiring
    tokens are picked up)."""
    if auth.kind == "basic":
        return lambda: (auth.username, Path(auth.password_file).read_text().strip())
    if auth.kind == "gce_metadata":
        return lambda: (ACCESS_TOKEN_USER, metadata_access_token(auth.metadata_url))
    return lambda: None


def metadata_access_token(base_url: str) -> str:
    """The VM's service-account token, from the metadata server (the agent's own reader)."""
    try:
        return HttpMetadata(base_url).access_token_now()
    except MetadataError as e:
        raise RegistryError(f"no access token from the metadata server: {e}") from e


def registry_catalog(cfg: RegistryImagesConfig) -> RegistryCatalog:
    client = RegistryClient(cfg.url, ca_file=cfg.ca_file, credentials=credentials(cfg.auth))
    return RegistryCatalog(client, cfg.repository, cfg.name, cfg.latest)


def open_feed(cfg: RegistryImagesConfig, clock: Clock) -> CatalogFeed:
    """A feed holding the registry's catalog as it is now (blocking; raises RegistryError if there
    is none to start with), refreshed every `refresh_s` of `clock`."""
    source = registry_catalog(cfg)
    try:
        catalog = source.fetch()
    except ValueError as e:  # read, but no catalog can be made of it (no version tags, say)
        raise RegistryError(f"{cfg.url}/{cfg.repository}: {e}", retryable=False) from e
    return CatalogFeed(catalog, source.fetch, cfg.refresh_s, clock, f"{cfg.url}/{cfg.repository}")
