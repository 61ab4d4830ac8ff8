"""Images, their layers, and a VM disk's layer cache. Pure domain: no I/O.

An image version (`gpu:v154`) is an ordered stack of layers; consecutive versions share most of
them, so a VM that holds v154 pulls only a few GB to serve v155. Both classes sit in the hot
loops of the simulator, so per-version facts are computed once, up front.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Collection, Iterable, KeysView, Mapping, Sequence

from provisioner.model.errors import InvalidArgument, quote

LATEST = "latest"
# name:tag, lower-case name as in container registries; the tag is the immutable version.
_REF = re.compile(r"^([a-z0-9][a-z0-9._/-]*):([A-Za-z0-9_][A-Za-z0-9._-]{0,127})$")


def parse_ref(ref: str) -> tuple[str, str] | None:
    """(name, tag) of a well-formed reference, else None. A bare name means `name:latest`."""
    if ":" not in ref:
        ref = f"{ref}:{LATEST}"
    m = _REF.match(ref)
    return (m.group(1), m.group(2)) if m else None


@dataclass(frozen=True, slots=True)
class Layer:
    id: str
    size_bytes: int


def synthetic_digest(layer_ids: Sequence[str]) -> str:
    """A stand-in manifest digest for a version known only by its layer list (the simulated
    cloud's catalog): stable, and different whenever the layers differ."""
    return "sha256:" + hashlib.sha256("\n".join(layer_ids).encode()).hexdigest()


class ImageCatalog:
    """Every known image version, its layers and its manifest digest. `versions` is given oldest
    first. A registry's catalog names layers by their digests and gives each version the digest
    its tag points to; a catalog without `digests` gets synthetic ones (synthetic_digest)."""

    def __init__(self, layers: Mapping[str, int], versions: Mapping[str, Sequence[str]], latest: str,
                 digests: Mapping[str, str] | None = None, repository: str = ""):
        for lid, size in layers.items():
            if not isinstance(size, int) or size < 0:
                raise ValueError(f"layer {lid!r}: size_bytes must be a non-negative int, got {size!r}")
        if not versions:
            raise ValueError("the catalog has no versions")
        for version, ids in versions.items():
            parsed = parse_ref(version)
            if parsed is None or ":" not in version or parsed[1] == LATEST:
                raise ValueError(f"version {version!r} is not of the form name:version")
            unknown = [i for i in ids if i not in layers]
            if unknown:
                raise ValueError(f"version {version!r} uses unknown layers {unknown}")
            if len(set(ids)) != len(ids):
                raise ValueError(f"version {version!r} lists a layer twice")
        if latest not in versions:
            raise ValueError(f"latest {latest!r} is not a catalog version")

        self.latest = latest
        self.repository = repository  # where the versions are pulled from (registry host/path), if known
        digests = digests or {}
        self._digests = {v: digests.get(v) or synthetic_digest(ids) for v, ids in versions.items()}
        self.layer_sizes: dict[str, int] = dict(layers)
        self._versions: tuple[str, ...] = tuple(versions)
        self._layers = {v: tuple(Layer(i, layers[i]) for i in ids) for v, ids in versions.items()}
        self._pairs = {v: tuple((i, layers[i]) for i in ids) for v, ids in versions.items()}
        self._ids = {v: frozenset(ids) for v, ids in versions.items()}
        self._sizes_of = {v: {i: layers[i] for i in ids} for v, ids in versions.items()}
        self._sizes = {v: sum(layers[i] for i in ids) for v, ids in versions.items()}
        # `name:latest` for each image name: the configured latest for its name, else the newest.
        self._latest_of: dict[str, str] = {}
        for v in self._versions:
            self._latest_of[v.split(":", 1)[0]] = v
        self._latest_of[latest.split(":", 1)[0]] = latest

    def __contains__(self, version: object) -> bool:
        return version in self._ids

    def __len__(self) -> int:
        return len(self._versions)

    def __repr__(self) -> str:
        return f"ImageCatalog({len(self._versions)} versions, {len(self.layer_sizes)} layers, latest={self.latest})"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._latest_of)

    def resolve(self, ref: str) -> str:
        """The immutable version a reference means now; `latest` is resolved here, once."""
        if ref in self._ids:
            return ref
        parsed = parse_ref(ref) if isinstance(ref, str) else None
        if parsed is None:
            raise InvalidArgument(f"malformed image reference {quote(ref)}: expected name:version, "
                                  f"e.g. {self.latest}", field="image")
        name, tag = parsed
        if name not in self._latest_of:
            raise InvalidArgument(f"unknown image {quote(name)}; known images: {', '.join(self.names)}",
                                  field="image")
        if tag == LATEST:
            return self._latest_of[name]
        known = [v for v in self._versions if v.startswith(name + ":")]
        raise InvalidArgument(f"unknown image version {quote(ref)}; known: {known[0]} .. {known[-1]}",
                              field="image")

    def versions(self) -> tuple[str, ...]:
        """Oldest to newest."""
        return self._versions

    def newest(self, n: int) -> tuple[str, ...]:
        """The n newest versions, newest first."""
        return self._versions[::-1][:max(0, n)]

    def digest(self, version: str) -> str:
        """The manifest digest the version's tag names in this catalog."""
        try:
            return self._digests[version]
        except KeyError:
            raise self._unknown(version) from None

    def keeping(self, old: ImageCatalog, versions: Collection[str]) -> ImageCatalog:
        """This catalog plus those of `versions` that only `old` has (as the oldest versions):
        a refresh must not forget a version that sessions or VMs still use."""
        kept = [v for v in old.versions() if v in versions and v not in self._ids]
        if not kept:
            return self
        order = kept + list(self._versions)
        layers = {**{i: old.layer_sizes[i] for v in kept for i in old._ids[v]}, **self.layer_sizes}
        ids = {v: [layer.id for layer in (self._layers.get(v) or old._layers[v])] for v in order}
        digests = {v: self._digests.get(v) or old._digests[v] for v in order}
        return ImageCatalog(layers, ids, self.latest, digests, self.repository)

    def same_as(self, other: ImageCatalog) -> bool:
        """The same versions, digests and latest (a refresh that changed nothing)."""
        return (self.latest, self._digests, self._versions, self.repository) == \
            (other.latest, other._digests, other._versions, other.repository)

    def layers(self, version: str) -> tuple[Layer, ...]:
        """Bottom layer first."""
        try:
            return self._layers[version]
        except KeyError:
            raise self._unknown(version) from None

    def layer_ids(self, version: str) -> frozenset[str]:
        try:
            return self._ids[version]
        except KeyError:
            raise self._unknown(version) from None

    def sizes_of(self, version: str) -> Mapping[str, int]:
        """Layer id -> size of the version's layers (one dict per version, made once: not to be changed)."""
        try:
            return self._sizes_of[version]
        except KeyError:
            raise self._unknown(version) from None

    def size_bytes(self, version: str) -> int:
        try:
            return self._sizes[version]
        except KeyError:
            raise self._unknown(version) from None

    def missing_bytes(self, version: str, cached_layer_ids: Collection[str]) -> int:
        """Bytes to pull for `version` onto a disk holding `cached_layer_ids`."""
        try:
            pairs = self._pairs[version]
        except KeyError:
            raise self._unknown(version) from None
        if not cached_layer_ids:
            return self._sizes[version]
        return sum(size for lid, size in pairs if lid not in cached_layer_ids)

    def _unknown(self, version: str) -> InvalidArgument:
        return InvalidArgument(f"unknown image version {quote(version)} (resolve references first)", field="image")


class LayerCache:
    """The layers on one VM's disk, bounded by capacity, evicting the least recently used.

    Eviction never removes a layer of the version being added, so a version bigger than the
    disk stays whole (over capacity) rather than being half-evicted. Ties in last use go to the
    lowest layer id, so the same operations always leave the same cache.
    """

    __slots__ = ("capacity_bytes", "_size", "_used_at", "_used", "_images", "_held", "_frozen", "_frozen_size")

    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must not be negative")
        self.capacity_bytes = int(capacity_bytes)
        self._size: dict[str, int] = {}
        self._used_at: dict[str, float] = {}
        self._used = 0
        # (catalog, versions wholly on disk), until the set of layers changes: asked every tick.
        self._images: tuple[ImageCatalog, tuple[str, ...]] | None = None
        # (catalog, version -> wholly on disk), the answers given since the set of layers last
        # changed: every idle VM is asked about each of its pool's top images whenever they move.
        self._held: tuple[ImageCatalog, dict[str, bool]] | None = None
        self._frozen: FrozenLayerCache | None = None  # a copy as it is now, until it changes
        self._frozen_size: dict[str, int] | None = None  # its layers, until they change (a touch keeps them)

    @property
    def layer_ids(self) -> KeysView[str]:
        """A live, read-only view (no copy: it is read in hot loops)."""
        return self._size.keys()

    @property
    def used_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LayerCache):
            return NotImplemented
        return (self.capacity_bytes, self._size, self._used_at) == (other.capacity_bytes, other._size, other._used_at)

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"LayerCache({len(self._size)} layers, {self._used}/{self.capacity_bytes} bytes)"

    def has_image(self, version: str, catalog: ImageCatalog) -> bool:
        held = self._held
        if held is None or held[0] is not catalog:
            held = self._held = (catalog, {})
        answers = held[1]
        answer = answers.get(version)
        if answer is None:
            answer = answers[version] = self._size.keys() >= catalog.layer_ids(version)
        return answer

    def missing(self, version: str, catalog: ImageCatalog) -> list[Layer]:
        size = self._size
        return [layer for layer in catalog.layers(version) if layer.id not in size]

    def images(self, catalog: ImageCatalog) -> tuple[str, ...]:
        """Versions wholly on disk, oldest first."""
        if self._images is None or self._images[0] is not catalog:
            size = self._size
            found = tuple(v for v in catalog.versions() if all(lid in size for lid in catalog.layer_ids(v)))
            self._images = (catalog, found)
        return self._images[1]

    def add(self, version: str, catalog: ImageCatalog, now: float) -> list[str]:
        """Records a pulled version; returns the evicted layer ids."""
        return self.add_layers(catalog.layers(version), now, keep=catalog.layer_ids(version))

    def add_layers(self, layers: Iterable[Layer], now: float, keep: Collection[str] = (),
                   spare: Collection[str] = ()) -> list[str]:
        """Adds and touches `layers`, then evicts LRU layers outside `layers` and `keep` until the
        cache fits, layers in `spare` only when no others are left. Returns the evicted layer ids,
        in eviction order."""
        layers = tuple(layers)
        size, used_at = self._size, self._used_at
        self._frozen = None
        for layer in layers:
            lid = layer.id
            if lid not in size:
                size[lid] = layer.size_bytes
                self._used += layer.size_bytes
                self._images = self._held = self._frozen_size = None
            used_at[lid] = now
        if self._used <= self.capacity_bytes:
            return []
        added = set(keep)  # what must stay: made only when something must go
        added.update(layer.id for layer in layers)
        evicted: list[str] = []
        victims = sorted((lid in spare, t, lid) for lid, t in used_at.items() if lid not in added)
        for _, _, lid in victims:
            if self._used <= self.capacity_bytes:
                break
            self._used -= size.pop(lid)
            del used_at[lid]
            evicted.append(lid)
            self._images = self._held = self._frozen_size = None
        return evicted

    def touch(self, version: str, catalog: ImageCatalog, now: float) -> None:
        """Marks the version's cached layers as used (a session started on it)."""
        used_at = self._used_at
        self._frozen = None
        for lid in catalog.layer_ids(version):
            if lid in used_at:
                used_at[lid] = now

    def clear(self) -> None:
        self._frozen = self._frozen_size = None
        self._size.clear()
        self._used_at.clear()
        self._used = 0
        self._images = self._held = None

    def copy(self) -> LayerCache:
        """A copy to change (the answers remembered are not copied)."""
        return self._copy(LayerCache, dict(self._size))

    def _copy(self, kind: type[LayerCache], size: dict[str, int]) -> LayerCache:
        c = object.__new__(kind)
        c.capacity_bytes, c._size, c._used_at, c._used = self.capacity_bytes, size, dict(self._used_at), self._used
        c._images, c._held, c._frozen, c._frozen_size = self._images, None, None, None
        return c

    def frozen(self) -> FrozenLayerCache:
        """The cache as it is now, a copy that cannot change; made again only after a change. Its
        layers' sizes are shared with the frozen copies made since they last changed (a session's
        start touches the layers it uses, which changes when they were used, not which they are)."""
        if self._frozen is None:
            if self._frozen_size is None:
                self._frozen_size = dict(self._size)
            self._frozen = self._copy(FrozenLayerCache, self._frozen_size)
        return self._frozen

    def to_dict(self) -> dict:
        return {"capacity_bytes": self.capacity_bytes,
                "layers": [[lid, self._size[lid], self._used_at[lid]] for lid in sorted(self._size)]}

    @classmethod
    def from_dict(cls, d: Mapping) -> LayerCache:
        cache = cls(d["capacity_bytes"])
        for lid, size, used_at in d.get("layers", ()):
            cache._size[lid] = size
            cache._used_at[lid] = used_at
            cache._used += size
        return cache


class FrozenLayerCache(LayerCache):
    """A VM's cache as it was at one step: read like any cache, never changed (what a frozen VM
    record holds, decide/changes.py)."""

    __slots__ = ()

    def frozen(self) -> FrozenLayerCache:
        return self

    def add_layers(self, *args, **kwargs) -> list[str]:
        raise TypeError("a frozen layer cache cannot change")

    def touch(self, *args, **kwargs) -> None:
        raise TypeError("a frozen layer cache cannot change")

    def clear(self) -> None:
        raise TypeError("a frozen layer cache cannot change")
