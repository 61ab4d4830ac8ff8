"""clusters/fleet.yaml and clusters/images.yaml, and the whole fleet they make with the clusters' files."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, NonNegativeFloat, PositiveFloat, model_validator

from provisioner.config.base import GB, Address, _At, _Model
from provisioner.config.cluster import ClusterConfig
from provisioner.config.policy import AbuseConfig, PriorityConfig, QuotaConfig, RateLimitConfig
from provisioner.config.registry import RegistryImagesConfig
from provisioner.model.images import LATEST, ImageCatalog, parse_ref


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
