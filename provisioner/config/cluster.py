"""clusters/<name>.yaml: one regional cluster, its cloud backend and its pools."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, model_validator

from provisioner.config.base import GB, Address, Name, Probability, _At, _Model
from provisioner.config.gce import GceSettings, PoolVmSettings

# Warm VMs above demand, as a fraction of demand: 100 is far beyond any sane pool, and keeps the
# autoscaler's arithmetic finite.
MAX_HEADROOM_FRACTION = 100.0


class SimCloudConfig(_Model):
    """Physics of the simulated cloud (used when backend.kind is sim, and for estimates)."""

    boot_s: NonNegativeFloat = 90.0
    boot_jitter_s: NonNegativeFloat = 10.0
    pull_bytes_per_s: PositiveFloat = 41_666_667.0  # 25 GB in ~10 minutes
    wipe_s: NonNegativeFloat = 20.0
    delete_s: NonNegativeFloat = 30.0
    stop_s: NonNegativeFloat = 15.0  # until a stopped VM is terminated (its disk kept)
    # A session's notebook container: started until its endpoint answers; stopped (its grace).
    notebook_start_s: NonNegativeFloat = 3.0
    notebook_stop_s: NonNegativeFloat = 2.0
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
    # gce: the VMs' image, network, service account and agent: see config/gce.py GceSettings.
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
    # The notebook container's limits on the VM (0: none, the VM is the session's alone); the
    # pool's GPUs are always its own.
    notebook_cpus: NonNegativeFloat = 0.0
    notebook_memory_gb: NonNegativeFloat = 0.0
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
                if p.spot_tier:
                    raise _At(f"pools[{i}].spot_tier", "backend gke makes a pool's VMs as its node pool says, Spot "
                                                       "or not, never some of each; set spot_tier: false")
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
