"""Where the fleet config is found: --clusters, $PROVISIONER_CLUSTERS, /etc/provisioner, a source
checkout's clusters/; and an installed wheel, away from any checkout, finding it or saying where
it looked."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner import config
from provisioner.config import ConfigError, default_clusters_dir, find_clusters_dir, load_fleet

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_etc(monkeypatch, tmp_path):
    monkeypatch.delenv(config.ENV_CLUSTERS, raising=False)
    monkeypatch.setattr(config, "ETC_CLUSTERS", tmp_path / "etc-provisioner")
    return tmp_path / "etc-provisioner"


def test_order_flag_then_env_then_etc_then_checkout(no_etc, monkeypatch, tmp_path):
    assert find_clusters_dir() == default_clusters_dir()  # a source checkout
    shutil.copytree(default_clusters_dir(), no_etc)
    assert find_clusters_dir() == no_etc
    monkeypatch.setenv(config.ENV_CLUSTERS, str(tmp_path / "from-env"))
    assert find_clusters_dir() == tmp_path / "from-env"
    assert find_clusters_dir(tmp_path / "from-flag") == tmp_path / "from-flag"


def test_a_wrong_flag_or_variable_is_an_error_not_a_fallback(no_etc, monkeypatch, tmp_path):
    monkeypatch.setenv(config.ENV_CLUSTERS, str(tmp_path / "missing"))
    with pytest.raises(ConfigError) as info:
        load_fleet()
    assert str(tmp_path / "missing") in str(info.value)


def test_nowhere_names_every_place(no_etc, monkeypatch, tmp_path):
    monkeypatch.setattr(config, "default_clusters_dir", lambda: tmp_path / "site" / "clusters")
    with pytest.raises(ConfigError) as info:
        load_fleet()
    message = str(info.value)
    for place in ("--clusters", config.ENV_CLUSTERS, str(no_etc), str(tmp_path / "site" / "clusters")):
        assert place in message


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The package built as a wheel from a copy of the sources and installed into a directory
    of its own (its dependencies come from this environment)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "provisioner", src / "provisioner", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
                   check=True, capture_output=True, timeout=120)
    wheel, = (tmp / "dist").glob("provisioner-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp / "site"), str(wheel)],
                   check=True, capture_output=True, timeout=120)
    return tmp / "site"


def _run(site: Path, cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != config.ENV_CLUSTERS} | {"PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-c", "import sys, provisioner.cli as c; sys.exit(c.main())", *args],
                          cwd=cwd, env=environ | (env or {}), capture_output=True, text=True, timeout=60)


def test_installed_wheel_says_where_it_looked(installed, tmp_path):
    if (config.ETC_CLUSTERS / config.FLEET_FILE).exists():
        pytest.skip("this machine has a fleet config in /etc/provisioner")
    where = subprocess.run([sys.executable, "-c", "import provisioner; print(provisioner.__file__)"], cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(installed)}, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(installed))  # the wheel, not the checkout
    out = _run(installed, tmp_path, "serve", "cluster", "--name", "us-central1", "--data-dir", str(tmp_path / "d"))
    assert out.returncode != 0
    assert "no fleet.yaml found; looked in" in out.stderr
    assert "/etc/provisioner" in out.stderr and "PROVISIONER_CLUSTERS" in out.stderr
    assert str(installed / "clusters") in out.stderr


def test_installed_wheel_finds_the_config_the_environment_names(installed, tmp_path):
    shutil.copytree(default_clusters_dir(), tmp_path / "fleet")
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,user,kind,accelerator,image,region_hint,duration_s,abandon\n"
                     "0,alice,interactive,gpu-p100,gpu:latest,us-central1,600,0\n")
    out = _run(installed, tmp_path, "simulate", "--trace", str(trace), "--jobs", "1", "--json",
               env={config.ENV_CLUSTERS: str(tmp_path / "fleet")})
    assert out.returncode == 0, out.stderr
    assert '"sessions"' in out.stdout or '"fast_start_ratio"' in out.stdout
