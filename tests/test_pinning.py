"""A session pins its version's manifest digest at creation and keeps it; a new catalog (new
tags, a re-pushed tag, a deleted one) changes what new sessions get only. The core alone."""

from __future__ import annotations

from core_driver import Driver, make_core

from provisioner.decide import events as ev
from provisioner.decide.commands import Pull
from provisioner.model.images import ImageCatalog, synthetic_digest
from provisioner.model.states import SessionState as S


def repushed(catalog: ImageCatalog, version: str, drop: str = "") -> ImageCatalog:
    """The catalog after `version` was pushed again with a new top layer (and `drop` deleted)."""
    versions = {v: [layer.id for layer in catalog.layers(v)] for v in catalog.versions() if v != drop}
    versions[version] = versions[version][:-1] + [f"{version}-rebuilt"]
    layers = {**catalog.layer_sizes, f"{version}-rebuilt": 123_000_000}
    digests = {v: catalog.digest(v) for v in versions if v != version}
    return ImageCatalog(layers, versions, catalog.latest, digests | {version: "sha256:" + "ab" * 32},
                        repository="registry.example/nb")


def test_a_session_pins_the_digest_and_gets_its_own_secret():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0))
    a = d.allocate(image="gpu:v150")
    b = d.allocate(image="gpu:v150")
    assert a.image == "gpu:v150"
    assert a.image_digest == d.core.catalog.digest("gpu:v150") == synthetic_digest(
        [layer.id for layer in d.core.catalog.layers("gpu:v150")])
    assert len(a.access_token) >= 43 and a.access_token != b.access_token


def test_a_repushed_tag_changes_new_sessions_only_and_pulls_carry_the_pinned_digest():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0))
    old = d.allocate(image="gpu:v150")
    pinned = old.image_digest
    d.send(ev.CatalogChanged(d.now, repushed(d.core.catalog, "gpu:v150")))
    new = d.allocate(image="gpu:v150")
    assert old.image_digest == pinned != new.image_digest == "sha256:" + "ab" * 32
    d.run_until(lambda: old.state is S.RUNNING and new.state is S.RUNNING, 3600)
    pulls = {c.session_id: c for c in d.commands(Pull) if c.session_id}
    assert pulls[old.id].digest == pinned and pulls[new.id].digest == new.image_digest
    assert pulls[new.id].repository == "registry.example/nb"
    # The new session's VM pulled the re-pushed layer.
    assert "gpu:v150-rebuilt" in {layer.id for layer in pulls[new.id].layers}


def test_a_deleted_tag_stays_known_while_a_session_uses_it():
    d = Driver(make_core(min_vms=0, headroom_fraction=0.0))
    s = d.allocate(image="gpu:v150")
    d.send(ev.CatalogChanged(d.now, repushed(d.core.catalog, "gpu:v151", drop="gpu:v150")))
    assert "gpu:v150" in d.core.catalog and "gpu:v151-rebuilt" in d.core.catalog.layer_sizes
    d.run_until(lambda: s.state is S.RUNNING, 3600)
    assert s.image_digest == d.core.catalog.digest("gpu:v150")
