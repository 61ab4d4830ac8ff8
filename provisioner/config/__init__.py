"""The fleet, declared in clusters/: one validated model per file, errors naming file and field.

clusters/fleet.yaml    FleetSettings (fleet.py): front address, session limits, quotas, routing, abuse
                       detection, priority and preemption (the policy sections' models: policy.py)
clusters/images.yaml   ImageCatalogConfig (fleet.py): layers and versions (oldest first), or a
                       `registry:` section whose tags are the versions (registry.py)
clusters/<name>.yaml   ClusterConfig (cluster.py): one regional cluster, its cloud backend (gce.py) and
                       pools

This module finds the directory and loads it; the models are re-exported here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from provisioner.config.base import GB, ConfigError, _At, _Model
from provisioner.config.cluster import BackendConfig, ClusterConfig, PoolConfig, SimCloudConfig
from provisioner.config.fleet import (FleetConfig, FleetSettings, FrontConfig, ImageCatalogConfig, IssuerConfig,
                                      RegionsConfig, RegistryImagesFile, SecurityConfig, SessionsConfig, TracingConfig)
from provisioner.model.images import ImageCatalog

__all__ = ["BackendConfig", "ClusterConfig", "ConfigError", "FLEET_FILE", "FleetConfig", "FleetSettings", "FrontConfig",
           "GB", "IMAGES_FILE", "IssuerConfig", "PoolConfig", "RegionsConfig", "SecurityConfig", "SessionsConfig",
           "SimCloudConfig", "TracingConfig", "default_clusters_dir", "find_clusters_dir", "load_catalog", "load_cluster",
           "load_fleet", "load_settings"]

FLEET_FILE = "fleet.yaml"
IMAGES_FILE = "images.yaml"


ENV_CLUSTERS = "PROVISIONER_CLUSTERS"
ETC_CLUSTERS = Path("/etc/provisioner")


def default_clusters_dir() -> Path:
    """The clusters/ of a source checkout (the package's parent directory); an installed wheel
    has none there."""
    return Path(__file__).resolve().parents[2] / "clusters"


def find_clusters_dir(given: str | Path | None = None) -> Path:
    """The fleet config directory: `given` (--clusters), else $PROVISIONER_CLUSTERS, else
    /etc/provisioner, else a source checkout's clusters/. The first one set is used as it is (a
    wrong flag or variable is an error, not a reason to look further); of the standard places, the
    first that holds a fleet.yaml. Raises ConfigError naming every place it looked."""
    if given is not None:
        return Path(given)
    if os.environ.get(ENV_CLUSTERS):
        return Path(os.environ[ENV_CLUSTERS])
    standard = (ETC_CLUSTERS, default_clusters_dir())
    for directory in standard:
        if (directory / FLEET_FILE).is_file():
            return directory
    looked = ", ".join(["--clusters (not given)", f"${ENV_CLUSTERS} (not set)", *(str(d) for d in standard)])
    raise ConfigError("<fleet config>", "<directory>", f"no {FLEET_FILE} found; looked in {looked}")


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """SafeLoader that rejects duplicate keys, which plain YAML silently lets the last one win.
    libyaml's parser where PyYAML has it (several times quicker: every replay reads the fleet)."""

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(path, "<file>", "file not found") from None
    except OSError as e:
        raise ConfigError(path, "<file>", f"cannot read: {e.strerror or e}") from None
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(path, "<yaml>", f"{where}{e.problem or e.context or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(path, "<yaml>", str(e)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(path, "<root>", f"expected a mapping, got {type(data).__name__}")
    return data


def _join(base: str, rest: str) -> str:
    if not base:
        return rest
    if not rest:
        return base
    return base + rest if rest.startswith("[") else f"{base}.{rest}"


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out = _join(out, f"[{part}]" if isinstance(part, int) else str(part))
    return out


def _problems(e: ValidationError) -> list[tuple[str, str]]:
    """(field, reason) for each pydantic error, in terms a config author reads."""
    out = []
    for err in e.errors():
        field = _dotted(err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, _At):
            field, reason = _join(field, cause.path), str(cause)
        elif err["type"] == "extra_forbidden":
            reason = "unknown field"
        elif err["type"] == "missing":
            reason = "required field is missing"
        else:
            reason = err["msg"].removeprefix("Value error, ")
            if not isinstance(err.get("input"), (dict, list, tuple)):
                reason += f" (got {err.get('input')!r})"
        out.append((field or "<root>", reason))
    return out


def _validate(model: type[_Model], data: dict, path: Path):
    try:
        return model.model_validate(data)
    except ValidationError as e:
        (field, reason), *more = _problems(e)
        raise ConfigError(path, field, reason, tuple(more)) from None


def load_cluster(path: str | Path) -> ClusterConfig:
    path = Path(path)
    return _validate(ClusterConfig, _read_yaml(path), path)


def load_settings(path: str | Path) -> FleetSettings:
    path = Path(path)
    return _validate(FleetSettings, _read_yaml(path), path)


def load_catalog(path: str | Path) -> ImageCatalog:
    path = Path(path)
    return _validate(ImageCatalogConfig, _read_yaml(path), path).catalog()


def load_fleet(directory: str | Path | None = None) -> FleetConfig:
    """fleet.yaml, images.yaml, and every other *.yaml in `directory` as one cluster each."""
    directory = find_clusters_dir(directory)
    if not directory.is_dir():
        raise ConfigError(directory, "<directory>", "not a directory (or missing)")
    settings = load_settings(directory / FLEET_FILE)
    images = _read_yaml(directory / IMAGES_FILE)
    if "registry" in images:
        catalog = None
        registry = _validate(RegistryImagesFile, images, directory / IMAGES_FILE).registry.resolved(directory)
    else:
        catalog, registry = _validate(ImageCatalogConfig, images, directory / IMAGES_FILE).catalog(), None
    files = sorted(p for p in directory.glob("*.yaml") if p.name not in (FLEET_FILE, IMAGES_FILE))
    if not files:
        raise ConfigError(directory, "<directory>", "no cluster files (*.yaml besides fleet.yaml and images.yaml)")
    clusters = tuple(load_cluster(p) for p in files)
    try:
        return FleetConfig(clusters=clusters, settings=settings, catalog=catalog, registry=registry)
    except ValidationError as e:
        # Cross-file problems: point at the file the offending part came from.
        (field, reason), *_ = _problems(e)
        m = re.match(r"^clusters\[(\d+)\]\.(.*)$", field)
        if m:
            raise ConfigError(files[int(m.group(1))], m.group(2), reason) from None
        if field.startswith("settings."):
            raise ConfigError(directory / FLEET_FILE, field.removeprefix("settings."), reason) from None
        raise ConfigError(directory, field, reason) from None
