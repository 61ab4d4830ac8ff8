"""The registry is the catalog: an image family's versions are the tags of one repository.

RegistryCatalog reads the tags, the digest each names (a HEAD per tag) and each new digest's
manifest (manifests are immutable by digest, so each is fetched once per process), and builds the
pure ImageCatalog on real digests: layers are named by their digests, so versions share layers
exactly as the registry stores them. Versions are ordered by their tags in natural order (v9 <
v10); `latest` is the configured tag, else the version whose digest a `latest` tag names, else
the newest. CatalogFeed holds the current catalog, refreshes it on a period and tells its
subscribers; a failed refresh keeps the last good catalog.
"""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.parse
from typing import Callable

from provisioner.common.clock import Clock
from provisioner.model.images import LATEST, ImageCatalog
from provisioner.registry.client import Manifest, RegistryClient, RegistryError

log = logging.getLogger(__name__)

_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


def natural_key(tag: str) -> tuple:
    """Digits compare as numbers: v9 < v10 < v154."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", tag) if part)


def build_catalog(name: str, manifests: dict[str, Manifest], latest: str = "", repository: str = "") -> ImageCatalog:
    """The catalog of `name` from each version tag's manifest (`manifests`: tag -> manifest, a
    `latest` tag among them or not). `latest`: the configured tag, if any; `repository`: where
    the versions are pulled from (`host/path`)."""
    versions = sorted((t for t in manifests if t != LATEST), key=natural_key)
    if not versions:
        raise ValueError(f"the repository of {name} has no version tags")
    layers: dict[str, int] = {}
    for tag in versions:
        layers.update(manifests[tag].layers)
    if latest:
        if latest not in manifests:
            raise ValueError(f"the configured latest tag {latest!r} is not in the repository of {name}")
        newest = latest
    elif LATEST in manifests:
        newest = next((t for t in reversed(versions) if manifests[t].digest == manifests[LATEST].digest), versions[-1])
    else:
        newest = versions[-1]
    return ImageCatalog(layers, {f"{name}:{t}": [d for d, _ in manifests[t].layers] for t in versions},
                        f"{name}:{newest}", {f"{name}:{t}": manifests[t].digest for t in versions}, repository)


class RegistryCatalog:
    """Reads one repository's catalog. Blocking: call `fetch` off the event loop."""

    def __init__(self, client: RegistryClient, repository: str, name: str = "", latest: str = ""):
        self.client = client
        self.repository = repository
        self.name = name or repository.rsplit("/", 1)[-1]
        self.latest = latest
        self._by_digest: dict[str, Manifest] = {}

    def fetch(self) -> ImageCatalog:
        """The catalog as the registry has it now; RegistryError or ValueError if it cannot be made."""
        manifests = {}
        for tag in self.client.tags(self.repository):
            if not _TAG.match(tag):
                continue
            digest = self.client.digest(self.repository, tag)
            if digest not in self._by_digest:
                self._by_digest[digest] = self.client.manifest(self.repository, digest)
            manifests[tag] = self._by_digest[digest]
        host = urllib.parse.urlparse(self.client.url).netloc
        return build_catalog(self.name, manifests, self.latest, f"{host}/{self.repository}")


class CatalogFeed:
    """The current catalog, refreshed every `refresh_s` of `clock` by `fetch` (None: it never
    changes, as the simulated cloud's synthetic catalog). Subscribers hear of each change."""

    def __init__(self, catalog: ImageCatalog, fetch: Callable[[], ImageCatalog] | None = None,
                 refresh_s: float = 300.0, clock: Clock | None = None, source: str = "images.yaml"):
        self.current = catalog
        self._fetch = fetch
        self.refresh_s = refresh_s
        self.clock = clock
        self.source = source
        self._subscribers: list[Callable[[ImageCatalog], None]] = []
        self.refreshes = {"changed": 0, "unchanged": 0, "failed": 0}
        self.last_error = ""

    def subscribe(self, fn: Callable[[ImageCatalog], None]) -> None:
        self._subscribers.append(fn)

    def unsubscribe(self, fn: Callable[[ImageCatalog], None]) -> None:
        if fn in self._subscribers:
            self._subscribers.remove(fn)

    async def refresh(self) -> bool:
        """One refresh; True if the catalog changed. A failure is logged and counted, and the
        last good catalog stays."""
        if self._fetch is None:
            return False
        try:
            new = await asyncio.to_thread(self._fetch)
        except Exception as e:  # noqa: BLE001 - whatever failed, the last good catalog stays
            self.refreshes["failed"] += 1
            self.last_error = str(e)
            log.warning("image catalog refresh from %s failed, keeping the last good catalog: %s", self.source, e,
                        exc_info=not isinstance(e, (RegistryError, ValueError)))
            return False
        if new.same_as(self.current):
            self.refreshes["unchanged"] += 1
            return False
        self.refreshes["changed"] += 1
        self.current = new
        log.info("image catalog from %s: %d versions, latest %s", self.source, len(new), new.latest)
        for fn in list(self._subscribers):
            fn(new)
        return True

    async def run(self) -> None:
        """Refreshes for ever (cancel to stop)."""
        if self._fetch is None or self.clock is None:
            return
        while True:
            await self.clock.sleep(self.refresh_s)
            await self.refresh()
