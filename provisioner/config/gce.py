"""The Compute Engine side of a cluster's config: how its VMs are made (clusters/<name>.yaml,
`backend` and each pool). Kept apart from cluster.py so the cloud's vocabulary stays in one place.

Disk prices are Compute Engine's list prices per GB-month (us-central1), billed hourly over 730 h:
a pool's stopped-VM price follows from its disk's type and size unless it is given.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveFloat, model_validator

from provisioner.config.base import _At, _Model

# Any VM created by the gce backend may call Google APIs as its service account; what it may do
# is then the account's roles (Google's recommended practice), not the scopes.
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
DISK_USD_PER_GB_MONTH = {"pd-standard": 0.04, "pd-balanced": 0.10, "pd-ssd": 0.17}
HOURS_PER_MONTH = 730.0
DiskType = Literal["pd-standard", "pd-balanced", "pd-ssd"]


def disk_hourly_price(disk_type: str, size_gb: float) -> float:
    return round(DISK_USD_PER_GB_MONTH[disk_type] * size_gb / HOURS_PER_MONTH, 4)


class GceSettings(_Model):
    """How the gce backend makes a VM (BackendConfig's Compute Engine fields)."""

    # The boot disk's image. The default (a Deep Learning VM image) has docker and installs the
    # NVIDIA driver when `install-nvidia-driver` is TRUE; the startup script installs the agent.
    boot_image: str = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"
    # An instance template for what a pool does not decide (network tags, extra metadata,
    # shielded VM...): each pool's machine type, GPUs, boot disk and scheduling still apply.
    instance_template: str | None = None
    network: str = "global/networks/default"
    # Custom-mode and Shared VPC networks need it, e.g. regions/us-central1/subnetworks/notebooks
    # (Shared VPC: projects/HOST/regions/REGION/subnetworks/NAME).
    subnetwork: str | None = None
    # What the VM runs as: pulls from Artifact Registry, writes logs and metrics. "default" is the
    # project's Compute Engine default service account; a dedicated one is better (docs/google-cloud.md).
    service_account: str = Field(default="default", min_length=1)
    scopes: tuple[str, ...] = (CLOUD_PLATFORM,)
    # What the startup script installs as the agent: a wheel of this package the VMs can read (a
    # gs:// path or a URL, with its extra: `...whl[server]`) or a requirement on an index they
    # reach; `preinstalled` when the boot image has the agent. Required on gce: no default names
    # a package we do not publish. And whether the boot image should install the NVIDIA driver.
    agent_package: str | None = Field(default=None, min_length=1)
    install_gpu_driver: bool = True
    # An agent command with no news this long is asked again (its answer may have been dropped),
    # and given up after two askings: minutes, not command_timeout_s.
    command_silence_s: PositiveFloat = 120.0


class PoolVmSettings(_Model):
    """A pool's VMs on Compute Engine: disk type and provisioning model (PoolConfig's fields)."""

    boot_disk_type: DiskType = "pd-balanced"
    # spot: Spot VMs (cheaper, may be preempted at any time with 30 s notice); standard otherwise.
    provisioning_model: Literal["standard", "spot"] = "standard"
    # A Spot VM's running price as a share of the on-demand one (its disk is billed in full).
    spot_price_fraction: float = Field(default=0.35, gt=0.0, le=1.0)
    # How often the simulated cloud (sim backend, `provisioner simulate`) preempts a running Spot
    # VM: a Poisson rate per VM-hour. Compute Engine publishes none; measure your own and set it.
    spot_preemptions_per_hour: float = Field(default=0.05, ge=0.0)
    # An on-demand pool's Spot tier: batch sessions, and the VMs kept for them (warm or stopped),
    # may run on Spot VMs; interactive sessions never do (docs/warm-pools.md#the-spot-tier).
    spot_tier: bool = False

    @model_validator(mode="before")
    @classmethod
    def _disk_price(cls, data: Any) -> Any:
        """A stopped VM bills for its disk alone: priced from the disk's type and size unless given."""
        if isinstance(data, dict) and data.get("disk_hourly_price_usd") is None:
            data = {**data, "disk_hourly_price_usd": disk_hourly_price(
                data.get("boot_disk_type", "pd-balanced"), float(data.get("disk_cache_gb", 250.0)))}
        return data

    @model_validator(mode="after")
    def _tier(self) -> PoolVmSettings:
        if self.spot_tier and self.spot:
            raise _At("spot_tier", "a pool on Spot VMs (provisioning_model: spot) has no on-demand part to add a "
                                   "Spot tier to; set one or the other")
        return self

    @property
    def spot(self) -> bool:
        return self.provisioning_model == "spot"

    @property
    def spot_usd_per_h(self) -> float:
        """A running Spot VM's price: Spot discounts the machine and its GPUs, not the disk."""
        hourly, disk = self.hourly_price_usd, self.disk_hourly_price_usd  # type: ignore[attr-defined]
        return round(disk + (hourly - disk) * self.spot_price_fraction, 4)

    @property
    def running_usd_per_h(self) -> float:
        """A running VM's price: the Spot price in a pool on Spot VMs."""
        return self.spot_usd_per_h if self.spot else self.hourly_price_usd  # type: ignore[attr-defined]
