"""The shipped fleet loads; each kind of mistake names its file, field and reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from provisioner.config import (ClusterConfig, ConfigError, FleetConfig, default_clusters_dir, load_catalog,
                                load_cluster, load_fleet)


@pytest.fixture
def fleet_dir(tmp_path: Path) -> Path:
    d = tmp_path / "clusters"
    shutil.copytree(default_clusters_dir(), d)
    return d


def edit(path: Path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def fails(directory: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_fleet(directory)
    return info.value


def test_shipped_fleet_loads():
    fleet = load_fleet(default_clusters_dir())
    assert isinstance(fleet, FleetConfig)
    assert set(fleet.cluster_names) == {"us-central1", "europe-west4", "asia-east1"}
    us = fleet.cluster("us-central1")
    assert us.region == "us-central1" and us.backend.kind == "sim"
    for c in fleet.clusters:
        assert c.pool_names == ("gpu-p100", "gpu-t4x2")
        assert c.pool("gpu-t4x2").accelerator == "nvidia-tesla-t4"
        assert c.pool("gpu-t4x2").accelerator_count == 2
        assert all(z.startswith(c.region + "-") for p in c.pools for z in p.zones)
    assert len({c.address for c in fleet.clusters}) == 3
    assert fleet.settings.front.address == "127.0.0.1:50051"
    assert fleet.settings.sessions.idle_timeout_s == 3600
    assert fleet.settings.quotas.gpu_hours_per_week == 30
    assert fleet.catalog.latest == "gpu:v160" and len(fleet.catalog.versions()) == 61


def test_lookups_by_name_explain_misses():
    fleet = load_fleet(default_clusters_dir())
    with pytest.raises(KeyError, match="no cluster 'mars-north1'.*us-central1"):
        fleet.cluster("mars-north1")
    with pytest.raises(KeyError, match="no pool 'gpu-h100'.*gpu-p100"):
        fleet.cluster("asia-east1").pool("gpu-h100")


def test_models_are_frozen():
    pool = load_fleet(default_clusters_dir()).cluster("us-central1").pools[0]
    with pytest.raises(Exception):
        pool.max_vms = 99


def test_unknown_field(fleet_dir: Path):
    edit(fleet_dir / "europe-west4.yaml", lambda d: d["pools"][0].update(max_vm=3))
    e = fails(fleet_dir)
    assert e.file.endswith("europe-west4.yaml")
    assert (e.field, e.reason) == ("pools[0].max_vm", "unknown field")
    assert str(e) == f"{e.file}: pools[0].max_vm: unknown field"


def test_negative_max_vms(fleet_dir: Path):
    edit(fleet_dir / "us-central1.yaml", lambda d: d["pools"][1].update(min_vms=0, max_vms=-1))
    e = fails(fleet_dir)
    assert e.file.endswith("us-central1.yaml") and e.field == "pools[1].max_vms"
    assert "greater than or equal to 0" in e.reason and "-1" in e.reason


def test_min_above_max(fleet_dir: Path):
    edit(fleet_dir / "us-central1.yaml", lambda d: d["pools"][0].update(min_vms=5, max_vms=2))
    e = fails(fleet_dir)
    assert (e.field, e.reason) == ("pools[0].max_vms", "must be >= min_vms (5), got 2")


@pytest.mark.parametrize("file, path, text", [
    ("us-central1.yaml", "pools[0].headroom_fraction", ".inf"),
    ("us-central1.yaml", "pools[1].hourly_price_usd", ".nan"),
    ("europe-west4.yaml", "sim.boot_s", ".inf"),
    ("asia-east1.yaml", "tick_s", ".inf"),
    ("fleet.yaml", "quotas.gpu_hours_per_week", ".inf"),
    ("fleet.yaml", "regions.inter_region_penalty_s", "-.inf"),
])
def test_non_finite_numbers_are_refused(fleet_dir: Path, file: str, path: str, text: str):
    # Written as YAML spells them: `.inf` once made every autoscaler tick raise.
    target = fleet_dir / file
    data = yaml.safe_load(target.read_text())
    *parents, leaf = path.replace("[", ".").replace("]", "").split(".")
    node = data
    for key in parents:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    node[leaf] = float(text.replace(".", "", 1))  # ".inf" -> float("inf")
    target.write_text(yaml.safe_dump(data, sort_keys=False))
    assert text in target.read_text()
    e = fails(fleet_dir)
    assert e.file.endswith(file) and e.field == path
    assert "finite number" in e.reason


def test_max_vms_limit_defaults_to_max_vms_and_may_not_be_below_it(fleet_dir: Path):
    pool = load_fleet(fleet_dir).cluster("us-central1").pool("gpu-t4x2")
    assert pool.max_vms_limit is None and pool.vm_ceiling == pool.max_vms
    edit(fleet_dir / "us-central1.yaml", lambda d: d["pools"][1].update(max_vms_limit=1000))
    assert load_fleet(fleet_dir).cluster("us-central1").pool("gpu-t4x2").vm_ceiling == 1000
    edit(fleet_dir / "us-central1.yaml", lambda d: d["pools"][1].update(max_vms=20, max_vms_limit=10))
    e = fails(fleet_dir)
    assert (e.field, e.reason) == ("pools[1].max_vms_limit", "must be >= max_vms (20), got 10")


def test_headroom_fraction_has_an_upper_bound(fleet_dir: Path):
    edit(fleet_dir / "us-central1.yaml", lambda d: d["pools"][0].update(headroom_fraction=1e300))
    e = fails(fleet_dir)
    assert e.field == "pools[0].headroom_fraction" and "less than or equal to 100" in e.reason


def test_a_standby_tier_is_refused_on_the_gke_backend(fleet_dir: Path):
    def gke(d: dict) -> None:
        d["backend"] = {"kind": "gke", "project": "p", "gke_cluster": "c"}
    edit(fleet_dir / "us-central1.yaml", gke)
    e = fails(fleet_dir)
    assert e.field == "pools[0].standby" and "backend gke cannot keep stopped VMs" in e.reason
    edit(fleet_dir / "us-central1.yaml", lambda d: [p.update(standby=False) for p in d["pools"]])
    assert not load_fleet(fleet_dir).cluster("us-central1").pools[0].standby


def test_zone_of_another_region(fleet_dir: Path):
    edit(fleet_dir / "asia-east1.yaml", lambda d: d["pools"][1]["zones"].append("us-central1-a"))
    e = fails(fleet_dir)
    assert e.file.endswith("asia-east1.yaml") and e.field == "pools[1].zones[2]"
    assert "not in region asia-east1" in e.reason


def test_duplicate_pool(fleet_dir: Path):
    edit(fleet_dir / "asia-east1.yaml", lambda d: d["pools"].append(dict(d["pools"][0])))
    e = fails(fleet_dir)
    assert (e.field, e.reason) == ("pools[2].name", "duplicate pool name 'gpu-p100'")


def test_duplicate_cluster_name_points_at_the_later_file(fleet_dir: Path):
    shutil.copy(fleet_dir / "us-central1.yaml", fleet_dir / "zz-copy.yaml")
    edit(fleet_dir / "zz-copy.yaml", lambda d: d.update(address="127.0.0.1:50069"))
    e = fails(fleet_dir)
    assert e.file.endswith("zz-copy.yaml") and e.field == "name" and "duplicate cluster" in e.reason


def test_bad_address_and_probability(fleet_dir: Path):
    edit(fleet_dir / "us-central1.yaml", lambda d: d.update(address="localhost"))
    e = fails(fleet_dir)
    assert e.field == "address" and "host:port" in e.reason
    edit(fleet_dir / "us-central1.yaml", lambda d: (d.update(address="127.0.0.1:50061"),
                                                    d["sim"].update(launch_failure_rate=1.5)))
    assert fails(fleet_dir).field == "sim.launch_failure_rate"


def test_several_errors_are_all_reported(fleet_dir: Path):
    edit(fleet_dir / "us-central1.yaml", lambda d: (d.update(tick_s=-1), d["sim"].update(bogus=1)))
    e = fails(fleet_dir)
    fields = [f for f, _ in e.errors]
    assert set(fields) == {"tick_s", "sim.bogus"}
    assert len(str(e).splitlines()) == 2


def test_unknown_layer_in_a_version(fleet_dir: Path):
    edit(fleet_dir / "images.yaml", lambda d: d["versions"]["gpu:v150"].append("no-such-layer"))
    e = fails(fleet_dir)
    assert e.file.endswith("images.yaml")
    assert (e.field, e.reason) == ("versions.gpu:v150[7]", "unknown layer 'no-such-layer'")


def test_latest_must_be_a_version(fleet_dir: Path):
    edit(fleet_dir / "images.yaml", lambda d: d.update(latest="gpu:v999"))
    e = fails(fleet_dir)
    assert e.field == "latest" and "gpu:v999" in e.reason


def test_images_from_a_registry(fleet_dir: Path):
    registry = {"url": "https://us-docker.pkg.dev", "repository": "proj/notebooks/gpu", "ca_file": "ca.pem",
                "auth": {"kind": "basic", "username": "reader", "password_file": "secret/password"}}
    (fleet_dir / "images.yaml").write_text(yaml.safe_dump({"registry": registry}))
    fleet = load_fleet(fleet_dir)
    assert fleet.catalog is None and fleet.registry.repository == "proj/notebooks/gpu"
    assert fleet.registry.ca_file == str(fleet_dir / "ca.pem")  # relative to the clusters directory
    assert fleet.registry.auth.password_file == str(fleet_dir / "secret/password")
    assert fleet.registry.refresh_s == 300

    (fleet_dir / "images.yaml").write_text(yaml.safe_dump({"registry": {**registry, "tags": ["v1"]}}))
    e = fails(fleet_dir)
    assert e.file.endswith("images.yaml") and (e.field, e.reason) == ("registry.tags", "unknown field")
    (fleet_dir / "images.yaml").write_text(yaml.safe_dump({"registry": {**registry, "auth": {"kind": "basic"}}}))
    e = fails(fleet_dir)
    assert e.field == "registry.auth.username" and "password_file" in e.reason


def test_disk_too_small_for_an_image(fleet_dir: Path):
    edit(fleet_dir / "europe-west4.yaml", lambda d: d["pools"][1].update(disk_cache_gb=10))
    e = fails(fleet_dir)
    assert e.file.endswith("europe-west4.yaml") and e.field == "pools[1].disk_cache_gb"


def test_bad_yaml_syntax(fleet_dir: Path):
    path = fleet_dir / "us-central1.yaml"
    path.write_text(path.read_text().replace("tick_s: 5", "tick_s: [5"))
    e = fails(fleet_dir)
    assert e.file.endswith("us-central1.yaml") and e.field == "<yaml>" and "line" in e.reason


def test_duplicate_yaml_key(fleet_dir: Path):
    path = fleet_dir / "fleet.yaml"
    path.write_text(path.read_text() + "\nfront:\n  address: 127.0.0.1:1\n")
    e = fails(fleet_dir)
    assert e.field == "<yaml>" and "duplicate key 'front'" in e.reason


def test_not_a_mapping(fleet_dir: Path):
    (fleet_dir / "asia-east1.yaml").write_text("- just\n- a list\n")
    e = fails(fleet_dir)
    assert e.field == "<root>"


def test_missing_files_and_directory(fleet_dir: Path, tmp_path: Path):
    (fleet_dir / "fleet.yaml").unlink()
    e = fails(fleet_dir)
    assert e.file.endswith("fleet.yaml") and e.reason == "file not found"
    e = fails(tmp_path / "nowhere")
    assert e.field == "<directory>"


def test_missing_images_file(fleet_dir: Path):
    (fleet_dir / "images.yaml").unlink()
    assert fails(fleet_dir).file.endswith("images.yaml")


def test_defaults_fill_optional_cluster_fields(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "name": "us-east1", "region": "us-east1", "address": "localhost:7000",
        "pools": [{"name": "gpu-t4", "accelerator": "nvidia-tesla-t4", "accelerator_count": 1,
                   "machine_type": "n1-standard-4", "zones": ["us-east1-c"], "min_vms": 0, "max_vms": 1,
                   "headroom_fraction": 0, "hourly_price_usd": 0.54}],
    }))
    c = load_cluster(path)
    assert isinstance(c, ClusterConfig)
    assert c.backend.kind == "sim" and c.tick_s == 5 and c.sim.boot_s == 90 and c.sim.seed == 0
    assert 590 < 25e9 / c.sim.pull_bytes_per_s < 610
    p = c.pool("gpu-t4")
    assert p.autoscaler == "headroom" and p.recycle and p.disk_cache_gb == 250
    assert p.disk_cache_bytes == 250 * 10**9


def test_load_catalog_alone():
    catalog = load_catalog(default_clusters_dir() / "images.yaml")
    assert catalog.resolve("gpu:latest") == "gpu:v160"
