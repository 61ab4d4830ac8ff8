"""The fleet, declared in clusters/: one validated model per file, errors naming file and field.

clusters/fleet.yaml    FleetSettings: front address, session limits, quotas, routing, abuse detection,
                       priority and preemption (the policy sections' models are in config_policy.py)
clusters/images.yaml   ImageCatalogConfig: layers and versions (oldest first), or a `registry:`
                       section whose tags are the versions (provisioner/registry/source.py)
clusters/<name>.yaml   ClusterConfig: one regional cluster, its cloud backend and pools
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (AfterValidator, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, ValidationError,
                      model_validator)

from provisioner.config_base import Name, _At, _Model
from provisioner.config_gce import GceSettings, PoolVmSettings
from provisioner.config_policy import AbuseConfig, PriorityConfig, QuotaConfig, RateLimitConfig
from provisioner.decide.images import LATEST, ImageCatalog, parse_ref
from provisioner.decide.policy import MAX_HEADROOM_FRACTION
from provisioner.registry.source import RegistryImagesConfig

FLEET_FILE = "fleet.yaml"
IMAGES_FILE = "images.yaml"
GB = 1_000_000_000  # disk and image sizes are decimal, as clouds bill them


class ConfigError(Exception):
    """A config file is wrong. `field` is a dotted path inside the file, e.g. `pools[1].max_vms`."""

    def __init__(self, file: str | Path, field: str, reason: str,
                 more: tuple[tuple[str, str], ...] = ()):
        self.file = str(file)
        self.field = field
        self.reason = reason
        self.errors = ((field, reason),) + tuple(more)  # every problem found, first one first
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(f"{self.file}: {f}: {r}" for f, r in self.errors)


# ---- field types -------------------------------------------------------------------------

_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})$")


def _host_port(v: str) -> str:
    m = _HOST_PORT.match(v)
    if not m or not 1 <= int(m.group(3)) <= 65535:
        raise ValueError(f"expected host:port with a port in 1..65535, got {v!r}")
    return v


Address = Annotated[str, AfterValidator(_host_port)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]


# ---- clusters/<name>.yaml ----------------------------------------------------------------

class SimCloudConfig(_Model):
    """Physics of the simulated cloud (used when backend.kind is sim, and for estimates)."""

    boot_s: NonNegativeFloat = 90.0
    boot_jitter_s: NonNegativeFloat = 10.0
    pull_bytes_per_s: PositiveFloat = 41_666_667.0  # 25 GB in ~10 minutes
    wipe_s: NonNegativeFloat = 20.0
    delete_s: NonNegativeFloat = 30.0
    stop_s: NonNegativeFloat = 15.0  # until a stopped VM is terminated (its disk kept)
    # A stopped VM started, until its agent answers: lognormal with this median and shape (0.6:
    # p90 about 2.2 times the median, p99 about 4 times). The GPU is attached anew on each start.
    start_median_s: PositiveFloat = 45.0
    start_sigma: NonNegativeFloat = 0.6
    pool_start_median_s: dict[str, PositiveFloat] = {}  # pool name -> its own median
    stocked_out_zones: tuple[str, ...] = ()
    launch_failure_rate: Probability = 0.0
    seed: int = 0


class BackendConfig(GceSettings):
    kind: Literal["sim", "gce", "gke"] = "sim"
    project: str | None = None
    # API endpoint override, for emulators and fake servers: no credentials are sent to it.
    # Without one, Application Default Credentials reach the real APIs.
    endpoint: str | None = None
    gke_cluster: str | None = None  # gke: the GKE cluster whose GPU node pools are the pools
    gke_location: str | None = None  # gke: its region or zone (default: the cluster's region)
    gke_endpoint: str | None = None  # gke: HOST:PORT of a ClusterManager emulator (plain gRPC)
    # gce: the VMs' image, network, service account and agent: see config_gce.GceSettings.
    retry_attempts: int = Field(default=5, ge=1)  # per call, on 429 and 5xx
    retry_total_s: PositiveFloat = 60.0  # per call, all attempts together
    max_concurrent_calls: int = Field(default=16, ge=1)
    call_timeout_s: PositiveFloat = 30.0
    poll_s: PositiveFloat = 2.0  # operations, boot and agent commands are polled this often
    operation_timeout_s: PositiveFloat = 600.0  # a Compute or GKE operation still running is given up
    boot_timeout_s: PositiveFloat = 900.0
    command_timeout_s: PositiveFloat = 3600.0  # an image pull on the VM's agent

    @model_validator(mode="after")
    def _check(self) -> BackendConfig:
        if self.kind != "sim" and not self.project:
            raise _At("project", f"backend {self.kind} needs the Google Cloud project")
        if self.kind == "gce" and not self.agent_package:
            raise _At("agent_package", "backend gce needs the agent its VMs install (a wheel's gs:// path or URL, "
                                       "or `preinstalled`: see docs/google-cloud.md)")
        if self.kind == "gke" and not self.gke_cluster:
            raise _At("gke_cluster", "backend gke needs the GKE cluster name")
        return self


class PoolConfig(PoolVmSettings):
    name: Name
    accelerator: str = Field(min_length=1)  # GCE accelerator type, e.g. nvidia-tesla-t4
    accelerator_count: int = Field(ge=1)
    machine_type: str = Field(min_length=1)
    zones: tuple[str, ...] = Field(min_length=1)
    min_vms: NonNegativeInt
    max_vms: NonNegativeInt
    # The most max_vms may be raised to through the API (SetPoolPolicy); default: max_vms.
    max_vms_limit: NonNegativeInt | None = None
    headroom_fraction: Annotated[float, Field(ge=0.0, le=MAX_HEADROOM_FRACTION)]
    autoscaler: Literal["fixed", "headroom", "predictive"] = "headroom"
    warm_vms: NonNegativeInt = 2  # fixed: warm VMs kept above demand
    wait_probability: Annotated[float, Field(gt=0.0, lt=0.5)] = 0.02  # predictive: target share of requests that wait
    recycle: bool = True  # after a session: wipe and return warm (true) or delete (false)
    hourly_price_usd: NonNegativeFloat  # a running VM, its disk included
    # A stopped VM: its disk alone (default: priced from boot_disk_type and disk_cache_gb).
    disk_hourly_price_usd: NonNegativeFloat
    disk_cache_gb: PositiveFloat = 250.0
    # Keep idle VMs beyond the warm target stopped (their disk, so their image cache, kept) rather
    # than deleted, and start them before creating new ones. Not on the gke backend.
    standby: bool = False
    # Fair share under a flood: the most VMs of this pool one user's sessions hold at once; more of
    # their sessions wait in the queue, other users' go first, and the pool does not grow for
    # them. 0: no ceiling.
    max_vms_per_user: NonNegativeInt = 0

    @model_validator(mode="after")
    def _check(self) -> PoolConfig:
        if self.min_vms > self.max_vms:
            raise _At("max_vms", f"must be >= min_vms ({self.min_vms}), got {self.max_vms}")
        if self.max_vms_limit is not None and self.max_vms_limit < self.max_vms:
            raise _At("max_vms_limit", f"must be >= max_vms ({self.max_vms}), got {self.max_vms_limit}")
        for i, z in enumerate(self.zones):
            if z in self.zones[:i]:
                raise _At(f"zones[{i}]", f"zone {z!r} listed twice")
        if self.disk_hourly_price_usd > self.hourly_price_usd:
            raise _At("disk_hourly_price_usd", f"a stopped VM cannot cost more than a running one "
                                               f"(hourly_price_usd {self.hourly_price_usd}), got {self.disk_hourly_price_usd}")
        return self

    @property
    def vm_ceiling(self) -> int:
        """The most VMs an operator may allow this pool through the API."""
        return self.max_vms if self.max_vms_limit is None else self.max_vms_limit

    @property
    def disk_cache_bytes(self) -> int:
        return int(self.disk_cache_gb * GB)


class ClusterConfig(_Model):
    name: Name
    region: str = Field(pattern=r"^[a-z]+-[a-z]+[0-9]+$")
    address: Address
    backend: BackendConfig = BackendConfig()
    sim: SimCloudConfig = SimCloudConfig()
    tick_s: PositiveFloat = 5.0  # control loop period
    pools: tuple[PoolConfig, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        prefix = self.region + "-"
        seen: set[str] = set()
        for i, p in enumerate(self.pools):
            if p.name in seen:
                raise _At(f"pools[{i}].name", f"duplicate pool name {p.name!r}")
            seen.add(p.name)
            for j, z in enumerate(p.zones):
                if not z.startswith(prefix):
                    raise _At(f"pools[{i}].zones[{j}]", f"zone {z!r} is not in region {self.region}")
        for j, z in enumerate(self.sim.stocked_out_zones):
            if not z.startswith(prefix):
                raise _At(f"sim.stocked_out_zones[{j}]", f"zone {z!r} is not in region {self.region}")
        if self.backend.kind == "gke":
            for i, p in enumerate(self.pools):
                if p.standby:
                    raise _At(f"pools[{i}].standby", "backend gke cannot keep stopped VMs (a node pool's nodes "
                                                     "are not stopped and started); set standby: false")
        for name in self.sim.pool_start_median_s:
            if name not in seen:
                raise _At(f"sim.pool_start_median_s.{name}", f"no pool {name!r}; pools: {', '.join(sorted(seen))}")
        return self

    def pool(self, name: str) -> PoolConfig:
        """A pool by name (sessions ask for `gpu-p100`, not for the accelerator type)."""
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(f"cluster {self.name} has no pool {name!r}; pools: {', '.join(self.pool_names)}")

    @property
    def pool_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pools)


# ---- clusters/fleet.yaml -----------------------------------------------------------------

class FrontConfig(_Model):
    address: Address = "127.0.0.1:50051"


class SessionsConfig(_Model):
    idle_timeout_s: PositiveFloat = 3600.0  # interactive sessions with no activity end
    batch_max_runtime_s: PositiveFloat = 43200.0
    max_runtime_limit_s: PositiveFloat = 86400.0  # the most any request may ask for
    queue_timeout_s: NonNegativeFloat = 0.0  # a session queued this long fails (0: it waits as long as it takes)
    # An ended session leaves the cluster's memory this long after it ended (0: never); the store
    # keeps it, and reads of it go there.
    retention_s: NonNegativeFloat = 3600.0
    # A running session's watchers are warned this long before its owner's weekly GPU budget
    # runs out (then it is stopped).
    budget_warnings_s: tuple[PositiveFloat, ...] = (1800.0, 300.0)

    @model_validator(mode="after")
    def _check(self) -> SessionsConfig:
        if self.batch_max_runtime_s > self.max_runtime_limit_s:
            raise _At("batch_max_runtime_s", f"must be <= max_runtime_limit_s ({self.max_runtime_limit_s})")
        return self


class RegionsConfig(_Model):
    inter_region_penalty_s: NonNegativeFloat = 30.0  # added to a remote cluster's time-to-ready


Role = Literal["user", "service", "admin"]


class IssuerConfig(_Model):
    """A trusted issuer of bearer tokens (JWT). Its keys come from a PEM public key file (relative
    paths are under the data dir) or from the issuer's published keys (jwks_url)."""

    issuer: str = Field(min_length=1)
    audience: str = Field(min_length=1)
    public_key_file: str | None = None
    jwks_url: str | None = None
    identity_claim: str = "sub"  # Google ID tokens of service accounts: "email"
    default_roles: tuple[Role, ...] = ()  # for identities not listed in `roles`
    roles: dict[str, tuple[Role, ...]] = {}

    @model_validator(mode="after")
    def _check(self) -> IssuerConfig:
        if (self.public_key_file is None) == (self.jwks_url is None):
            raise _At("public_key_file", "give exactly one of public_key_file and jwks_url")
        if self.jwks_url is not None and not self.jwks_url.startswith("https://"):
            raise _At("jwks_url", "must be an https:// URL")
        return self


class SecurityConfig(_Model):
    issuers: tuple[IssuerConfig, ...] = (
        IssuerConfig(issuer="provisioner-local", audience="provisioner", public_key_file="auth/token-key.pub.pem",
                     default_roles=("user",), roles={"local-operator": ("service", "admin")}),
    )
    # The name in the front's certificate, which clusters require of their callers.
    front_tls_name: str = Field(default="front.provisioner.internal", min_length=1)
    # More names the front's certificate carries: the addresses its clients dial, such as an
    # internal load balancer's DNS name or IP address (clients may instead override the name they
    # check: --server-name).
    front_tls_extra_names: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    # The name each cluster's certificate must carry; {cluster} is the cluster's name.
    cluster_tls_name: str = Field(default="{cluster}.cluster.provisioner.internal", pattern=r"\{cluster\}")
    # Open streams (WatchSession) one caller may hold on the front, by its broadest role.
    max_streams: dict[Role, Annotated[int, Field(ge=1)]] = {"user": 8, "service": 5000, "admin": 64}
    # How long the audit log keeps a record (operator actions, refused calls of known callers).
    audit_retention_s: Annotated[float, Field(gt=0)] = 90 * 86400.0

    def cluster_name(self, cluster: str) -> str:
        return self.cluster_tls_name.replace("{cluster}", cluster)


class TracingConfig(_Model):
    # The share of traces started in a process that are recorded (a call that arrives in a trace
    # keeps its caller's choice). Every one by default, so `provisioner trace` finds any session.
    sample_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0


class FleetSettings(_Model):
    front: FrontConfig = FrontConfig()
    sessions: SessionsConfig = SessionsConfig()
    quotas: QuotaConfig = QuotaConfig()
    rate_limits: RateLimitConfig = RateLimitConfig()
    regions: RegionsConfig = RegionsConfig()
    security: SecurityConfig = SecurityConfig()
    abuse: AbuseConfig = AbuseConfig()
    priority: PriorityConfig = PriorityConfig()
    tracing: TracingConfig = TracingConfig()

    @model_validator(mode="after")
    def _check(self) -> FleetSettings:
        if self.abuse.idle_busy_window_s >= self.sessions.idle_timeout_s:
            raise _At("abuse.idle_busy_window_s", f"must be < sessions.idle_timeout_s ({self.sessions.idle_timeout_s}): "
                      f"a session nobody touches ends first, got {self.abuse.idle_busy_window_s}")
        return self


# ---- clusters/images.yaml ----------------------------------------------------------------

class LayerConfig(_Model):
    size_bytes: int = Field(ge=1)


class ImageCatalogConfig(_Model):
    latest: str
    layers: dict[str, LayerConfig] = Field(min_length=1)
    versions: dict[str, tuple[str, ...]] = Field(min_length=1)  # oldest first, layers bottom first

    @model_validator(mode="after")
    def _check(self) -> ImageCatalogConfig:
        for v, ids in self.versions.items():
            parsed = parse_ref(v)
            if ":" not in v or parsed is None or parsed[1] == LATEST:
                raise _At(f"versions.{v}", "expected name:version, e.g. gpu:v154")
            if not ids:
                raise _At(f"versions.{v}", "a version needs at least one layer")
            for j, lid in enumerate(ids):
                if lid not in self.layers:
                    raise _At(f"versions.{v}[{j}]", f"unknown layer {lid!r}")
                if lid in ids[:j]:
                    raise _At(f"versions.{v}[{j}]", f"layer {lid!r} listed twice")
        if self.latest not in self.versions:
            raise _At("latest", f"{self.latest!r} is not one of the versions")
        return self

    def catalog(self) -> ImageCatalog:
        return ImageCatalog({k: layer.size_bytes for k, layer in self.layers.items()}, self.versions, self.latest)


class RegistryImagesFile(_Model):
    registry: RegistryImagesConfig


# ---- the whole fleet ---------------------------------------------------------------------

class FleetConfig(_Model):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True, allow_inf_nan=False)

    clusters: tuple[ClusterConfig, ...] = Field(min_length=1)
    settings: FleetSettings = FleetSettings()
    # The synthetic catalog of images.yaml; with `registry` instead, the process reads the
    # registry's when it starts (provisioner/registry/source.py: open_feed).
    catalog: ImageCatalog | None = None
    registry: RegistryImagesConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> FleetConfig:
        if (self.catalog is None) == (self.registry is None):
            raise _At("catalog", "give either a synthetic catalog or a registry to read it from")
        names: set[str] = set()
        addresses = {self.settings.front.address: "settings.front.address"}
        # Known only once read from a registry: a disk too small shows then as pulls on every start.
        biggest = max(self.catalog.size_bytes(v) for v in self.catalog.versions()) if self.catalog else 0
        for i, c in enumerate(self.clusters):
            if c.name in names:
                raise _At(f"clusters[{i}].name", f"duplicate cluster name {c.name!r}")
            names.add(c.name)
            if c.address in addresses:
                raise _At(f"clusters[{i}].address", f"{c.address} is already used by {addresses[c.address]}")
            addresses[c.address] = f"cluster {c.name}"
            for j, p in enumerate(c.pools):
                # A disk that cannot hold one whole image would pull on every session.
                if p.disk_cache_bytes < biggest:
                    raise _At(f"clusters[{i}].pools[{j}].disk_cache_gb",
                              f"{p.disk_cache_gb} GB cannot hold the largest image ({biggest / GB:.1f} GB)")
        return self

    @model_validator(mode="after")
    def _check_priority_pools(self) -> FleetConfig:
        pools = {p.name for c in self.clusters for p in c.pools}
        for name in self.settings.priority.pool_share_gpus_per_user:
            if name not in pools:
                raise _At(f"settings.priority.pool_share_gpus_per_user.{name}",
                          f"no cluster has a pool {name!r}; pools: {', '.join(sorted(pools))}")
        return self

    def cluster(self, name: str) -> ClusterConfig:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(f"no cluster {name!r} in the fleet; clusters: {', '.join(self.cluster_names)}")

    @property
    def cluster_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.clusters)


# ---- loading -----------------------------------------------------------------------------

ENV_CLUSTERS = "PROVISIONER_CLUSTERS"
ETC_CLUSTERS = Path("/etc/provisioner")


def default_clusters_dir() -> Path:
    """The clusters/ of a source checkout (the package's parent directory); an installed wheel
    has none there."""
    return Path(__file__).resolve().parent.parent / "clusters"


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


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, which plain YAML silently lets the last one win."""

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
