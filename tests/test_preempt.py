"""Priority classes and preemption: the `priority` section of the fleet config."""

from __future__ import annotations

import shutil

import pytest
import yaml

from provisioner.config import ConfigError, FleetSettings, default_clusters_dir, load_fleet, load_settings


# ---- config ----------------------------------------------------------------------------------

def _settings(tmp_path, text: str) -> FleetSettings:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return load_settings(path)


def test_the_defaults_keep_todays_behaviour_nothing_is_guaranteed_so_nothing_is_preempted():
    p = FleetSettings().priority
    assert p.classes["interactive"].rank > p.classes["batch"].rank
    assert not p.classes[p.class_of("interactive")].preemptible and p.classes[p.class_of("batch")].preemptible
    assert p.grace_period_s == 120.0
    assert p.share_gpus("gpu-p100") == 0
    assert load_fleet(default_clusters_dir()).settings.priority == p  # the shipped fleet.yaml spells out the defaults


def test_the_section_loads_with_classes_kinds_and_shares(tmp_path):
    p = _settings(tmp_path, """
priority:
  classes:
    notebook: {rank: 50}
    training: {rank: 20, preemptible: true}
    scavenger: {rank: 0, preemptible: true}
  kinds: {interactive: notebook, batch: training}
  grace_period_s: 300
  share_gpus_per_user: 1
  pool_share_gpus_per_user: {gpu-p100: 2}
""").priority
    assert (p.class_of("interactive"), p.class_of("batch")) == ("notebook", "training")
    assert p.classes["scavenger"].preemptible and not p.classes["notebook"].preemptible
    assert (p.grace_period_s, p.share_gpus("gpu-p100"), p.share_gpus("gpu-t4")) == (300, 2, 1)


@pytest.mark.parametrize("text, field, reason", [
    ("priority: {classes: {}}", "priority.classes", "at least one class"),
    ("priority: {classes: {interactive: {rank: 1}}}", "priority.kinds.batch", "no class 'batch'; classes: interactive"),
    ("priority: {kinds: {batch: low}}", "priority.kinds.batch", "no class 'low'"),
    ("priority: {kinds: {interactive: batch}}", "priority.classes.batch.preemptible", "never preempted"),
    ("priority: {classes: {interactive: {rank: 1, preemptible: true}, batch: {rank: 0}}}",
     "priority.classes.interactive.preemptible", "never preempted"),
    ("priority: {kinds: {training: batch}}", "priority.kinds.training[key]", "'interactive' or 'batch'"),
    ("priority: {classes: {interactive: {rank: -1}, batch: {rank: 0}}}", "priority.classes.interactive.rank",
     "greater than or equal to 0"),
    ("priority: {classes: {Interactive: {rank: 1}}}", "priority.classes.Interactive[key]", "should match pattern"),
    ("priority: {grace_period_s: -5}", "priority.grace_period_s", "greater than or equal to 0"),
    ("priority: {share_gpus_per_user: 1.5}", "priority.share_gpus_per_user", "integer"),
    ("priority: {classes: {batch: {rank: 1, typo: 2}}}", "priority.classes.batch.typo", "unknown field"),
])
def test_bad_settings_name_the_field(tmp_path, text, field, reason):
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path, text + "\n")
    assert err.value.field == field and reason in err.value.reason, str(err.value)


def test_a_share_for_a_pool_no_cluster_has_names_fleet_yaml_and_the_pools(tmp_path):
    d = tmp_path / "clusters"
    shutil.copytree(default_clusters_dir(), d)
    fleet = yaml.safe_load((d / "fleet.yaml").read_text())
    fleet["priority"]["pool_share_gpus_per_user"] = {"gpu-p1000": 2}
    (d / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    with pytest.raises(ConfigError) as err:
        load_fleet(d)
    e = err.value
    assert e.file == str(d / "fleet.yaml") and e.field == "priority.pool_share_gpus_per_user.gpu-p1000", str(e)
    assert "no cluster has a pool 'gpu-p1000'; pools: " in e.reason and "gpu-p100" in e.reason
