"""Image catalog and layer cache: resolution, sharing between versions, LRU eviction."""

from __future__ import annotations

import statistics

import pytest

from provisioner.config import default_clusters_dir, load_catalog
from provisioner.model.errors import InvalidArgument
from provisioner.model.images import ImageCatalog, Layer, LayerCache

GB = 10**9


@pytest.fixture(scope="module")
def catalog() -> ImageCatalog:
    return load_catalog(default_clusters_dir() / "images.yaml")


@pytest.fixture
def tiny() -> ImageCatalog:
    # v1 = a+b, v2 = a+c, v3 = d: a is shared by v1 and v2.
    return ImageCatalog({"a": 40, "b": 30, "c": 20, "d": 50},
                        {"img:v1": ("a", "b"), "img:v2": ("a", "c"), "img:v3": ("d",)}, latest="img:v2")


def test_resolve(catalog: ImageCatalog):
    assert catalog.resolve("gpu:latest") == "gpu:v160"
    assert catalog.resolve("gpu") == "gpu:v160"
    assert catalog.resolve("gpu:v154") == "gpu:v154"


@pytest.mark.parametrize("ref, words", [
    ("gpu:v999", "unknown image version"),
    ("cpu:v154", "unknown image 'cpu'"),
    ("gpu:", "malformed"),
    ("gpu:v1:v2", "malformed"),
    ("", "malformed"),
    ("GPU latest", "malformed"),
])
def test_resolve_rejects(catalog: ImageCatalog, ref: str, words: str):
    with pytest.raises(InvalidArgument, match=words) as info:
        catalog.resolve(ref)
    assert info.value.field == "image"


def test_versions_are_ordered(catalog: ImageCatalog):
    vs = catalog.versions()
    assert vs[0] == "gpu:v100" and vs[-1] == "gpu:v160" and len(vs) == 61
    assert catalog.newest(3) == ("gpu:v160", "gpu:v159", "gpu:v158")
    assert catalog.newest(0) == ()


def test_each_version_is_20_to_30_gb(catalog: ImageCatalog):
    for v in catalog.versions():
        assert 20 * GB <= catalog.size_bytes(v) <= 30 * GB, v
        assert sum(layer.size_bytes for layer in catalog.layers(v)) == catalog.size_bytes(v)


def test_consecutive_versions_share_most_bytes(catalog: ImageCatalog):
    def step(a: str, b: str) -> float:
        return catalog.missing_bytes(b, catalog.layer_ids(a)) / catalog.size_bytes(b)

    assert step("gpu:v154", "gpu:v155") < 0.15
    vs = catalog.versions()
    steps = [step(a, b) for a, b in zip(vs, vs[1:])]
    assert statistics.mean(steps) < 0.25  # an upgrade pulls ~1/5 of the image on average
    assert max(steps) < 0.6  # even when several layers change at once, the base stays
    # Far-apart versions share much less.
    assert step("gpu:v100", "gpu:v160") > 0.9


def test_missing_bytes(tiny: ImageCatalog):
    assert tiny.missing_bytes("img:v1", set()) == 70
    assert tiny.missing_bytes("img:v2", {"a", "b"}) == 20
    assert tiny.missing_bytes("img:v2", {"a", "c", "d"}) == 0
    with pytest.raises(InvalidArgument):
        tiny.missing_bytes("img:latest", set())


def test_catalog_rejects_bad_declarations():
    with pytest.raises(ValueError, match="unknown layers"):
        ImageCatalog({"a": 1}, {"img:v1": ("a", "b")}, "img:v1")
    with pytest.raises(ValueError, match="latest"):
        ImageCatalog({"a": 1}, {"img:v1": ("a",)}, "img:v2")


def test_has_image_and_missing(tiny: ImageCatalog):
    cache = LayerCache(1000)
    assert not cache.has_image("img:v1", tiny)
    assert cache.missing("img:v1", tiny) == [Layer("a", 40), Layer("b", 30)]
    cache.add("img:v1", tiny, now=1.0)
    assert cache.has_image("img:v1", tiny) and not cache.has_image("img:v2", tiny)
    assert cache.missing("img:v2", tiny) == [Layer("c", 20)]
    assert tiny.missing_bytes("img:v2", cache.layer_ids) == 20
    assert cache.used_bytes == 70 and cache.images(tiny) == ("img:v1",)
    cache.add("img:v2", tiny, now=2.0)
    assert cache.images(tiny) == ("img:v1", "img:v2") and cache.used_bytes == 90
    cache.clear()
    assert cache.used_bytes == 0 and not cache.layer_ids


def test_lru_evicts_least_recently_used_first(tiny: ImageCatalog):
    cache = LayerCache(100)
    cache.add("img:v1", tiny, now=1.0)  # a, b = 70
    cache.add("img:v2", tiny, now=2.0)  # + c = 90; a touched at 2
    # v3 (d=50) needs 40 freed: b (used at 1) goes first, then c (at 2) before a (at 2, tie -> id).
    evicted = cache.add("img:v3", tiny, now=3.0)
    assert evicted == ["b", "a"]
    assert set(cache.layer_ids) == {"c", "d"} and cache.used_bytes == 70


def test_touch_protects_a_version(tiny: ImageCatalog):
    cache = LayerCache(100)
    cache.add("img:v1", tiny, now=1.0)  # a, b
    cache.add("img:v2", tiny, now=2.0)  # c; a at 2
    cache.touch("img:v1", tiny, now=5.0)  # a, b now newest; c oldest
    assert cache.add("img:v3", tiny, now=6.0) == ["c", "a"]
    assert set(cache.layer_ids) == {"b", "d"}


def test_never_evicts_the_version_being_added(tiny: ImageCatalog):
    cache = LayerCache(60)
    cache.add("img:v1", tiny, now=1.0)  # 70 > 60: stays whole, over capacity
    assert cache.has_image("img:v1", tiny) and cache.used_bytes == 70
    cache.add("img:v3", tiny, now=2.0)
    assert set(cache.layer_ids) == {"d"}


def test_round_trip_and_determinism(tiny: ImageCatalog):
    def run() -> LayerCache:
        cache = LayerCache(100)
        for t, v in enumerate(["img:v1", "img:v3", "img:v2", "img:v1", "img:v3"]):
            cache.add(v, tiny, now=float(t))
        return cache

    a, b = run(), run()
    assert a == b
    assert LayerCache.from_dict(a.to_dict()) == a


def test_realistic_disk_holds_several_nearby_versions(catalog: ImageCatalog):
    cache = LayerCache(100 * GB)
    for t, v in enumerate(catalog.newest(10)):
        cache.add(v, catalog, now=float(t))
    # Ten neighbouring versions share enough to fit on one 100 GB disk together.
    assert len(cache.images(catalog)) == 10 and cache.used_bytes <= 100 * GB


def test_images_follow_every_change_of_the_cache(tiny: ImageCatalog):
    cache = LayerCache(100)
    assert cache.images(tiny) == ()
    cache.add("img:v1", tiny, now=1.0)
    assert cache.images(tiny) == ("img:v1",)
    cache.add("img:v2", tiny, now=2.0)
    assert cache.images(tiny) == ("img:v1", "img:v2")
    cache.add("img:v3", tiny, now=3.0)  # evicts b and a: v1 and v2 are gone
    assert cache.images(tiny) == ("img:v3",)
    cache.clear()
    assert cache.images(tiny) == ()
