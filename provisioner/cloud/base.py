"""The cloud interface the cluster provisioner drives.

Small and idempotent: a VM is named by our own id (also its request id), so a create retried
after a timeout finds the VM it already made. Errors come back as data (CloudFailure), never as
SDK exceptions; "not found" on delete is success.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol, Sequence

from provisioner.agent.usage import Usage
from provisioner.model.images import Layer

# Labels every VM carries, so a restarted cluster can match VMs to its records and find leaks.
LABEL_CLUSTER = "provisioner-cluster"
LABEL_POOL = "provisioner-pool"
LABEL_REQUEST = "provisioner-request"
LABEL_SESSION = "provisioner-session"

FailureCode = Literal[
    "stockout",  # the zone has no GPUs of this shape now (ZONE_RESOURCE_POOL_EXHAUSTED)
    "quota",  # the project's quota for this GPU in this region is used up
    "rate_limited",  # 429: back off and retry
    "unavailable",  # 5xx or connection failure: retry
    "not_found",
    "invalid",  # our request is wrong: do not retry
    "internal",
]

RETRYABLE_CODES = frozenset({"rate_limited", "unavailable"})
# Codes after which the zone, not the request, is the problem: try another zone.
ZONE_CODES = frozenset({"stockout", "quota"})


@dataclass(frozen=True, slots=True)
class CloudFailure:
    code: FailureCode
    message: str
    zone: str = ""
    # How far a stockout or quota failure reaches: the zone alone, its region (a regional quota)
    # or every region (a project-wide quota such as GPUS_ALL_REGIONS).
    scope: Literal["zone", "region", "project"] = "zone"
    # A quota of one GPU type is shared by that GPU's pools alone ("": by every pool).
    shared_by: str = ""
    # A stockout's hint: the zones that have the shape now (Compute's `zonesAvailable`).
    zones_available: tuple[str, ...] = ()
    # A quota's metric as the cloud named it (GPUS_ALL_REGIONS, NVIDIA_T4_GPUS), when it did.
    metric: str = ""

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE_CODES

    @property
    def zone_exhausted(self) -> bool:
        return self.code in ZONE_CODES


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    vm_id: str
    cluster: str
    pool: str
    zone: str
    machine_type: str
    accelerator: str
    accelerator_count: int
    labels: dict[str, str] = field(default_factory=dict)
    # Image versions the VM should pull as it boots (prewarming).
    images: tuple[str, ...] = ()
    spot: bool = False  # made as a Spot VM (a Spot pool's, or its Spot tier's)


@dataclass(frozen=True, slots=True)
class NotebookRequest:
    """A session's notebook container, as the VM's agent starts it. `repository` and `digest` pin
    the image (empty on the simulated cloud, whose catalog is synthetic)."""

    session_id: str
    user: str
    cluster: str
    image: str
    gpus: int
    repository: str = ""
    digest: str = ""
    secret: str = field(default="", repr=False)  # out of repr, so out of any log line
    cpus: float = 0.0  # 0: no limit
    memory_bytes: int = 0

    def agent_command(self) -> dict:
        """The agent's `start` command (provisioner/agent/notebook.py reads these fields)."""
        return {"op": "start", **{f: getattr(self, f) for f in self.__dataclass_fields__}}


@dataclass(frozen=True, slots=True)
class CloudVm:
    vm_id: str
    zone: str
    status: Literal["provisioning", "running", "stopping", "terminated"]
    labels: dict[str, str] = field(default_factory=dict)
    # Where a notebook kernel on this VM is reached.
    endpoint: str = ""
    spot: bool = False  # a Spot VM: the cloud may preempt (stop) it at any time


@dataclass(frozen=True, slots=True)
class HealthReport:
    healthy: bool
    gpu_temperature_c: float = 0.0
    hardware_errors: int = 0
    detail: str = ""
    usage: Usage | None = None  # what the session runs, as the VM's agent last reported it
    # Why the VM is going away, when the cloud takes it: a Spot preemption or host maintenance.
    cause: Literal["", "preempted", "maintenance"] = ""


ProgressCallback = Callable[[int], None]
PREEMPTED = "preempted (spot)"


def maintenance(event: str) -> str:
    return f"host maintenance ({event})"


class CloudBackend(Protocol):
    """One cluster's view of its cloud. Every method is safe to retry."""

    name: str

    async def create(self, spec: LaunchSpec) -> CloudVm | CloudFailure:
        """Creates the VM (returns once the cloud has it, still booting)."""
        ...

    async def wait_ready(self, vm_id: str, zone: str) -> CloudVm | CloudFailure:
        """Returns when the VM has booted and its agent answers."""
        ...

    async def pull(
        self, vm_id: str, zone: str, layers: Sequence[Layer], on_progress: ProgressCallback | None = None,
        repository: str = "", digest: str = "",
    ) -> CloudFailure | None:
        """Pulls the image `repository@digest` onto the VM's disk (`layers`: those it lacks, for
        progress and accounting); on_progress gets cumulative bytes."""
        ...

    async def wipe(self, vm_id: str, zone: str) -> CloudFailure | None:
        """Erases user data (home, processes, GPU memory) and keeps the image cache."""
        ...

    async def start_notebook(self, vm_id: str, zone: str, request: NotebookRequest) -> str | CloudFailure:
        """Starts the session's notebook container on the VM; returns once it answers, with its
        endpoint ("" for the VM's own). A second start of the same session finds it running."""
        ...

    async def stop_notebook(self, vm_id: str, zone: str, session_id: str) -> CloudFailure | None:
        """Ends the session's notebook container (SIGTERM, a grace period, SIGKILL)."""
        ...

    async def stop(self, vm_id: str, zone: str) -> CloudFailure | None:
        """Stops the VM and returns once it is terminated: it keeps its disk (so its image cache)
        and bills for the disk alone. A VM already stopped counts as stopped."""
        ...

    async def start(self, vm_id: str, zone: str) -> CloudVm | CloudFailure:
        """Starts a stopped VM (returns once the cloud runs it, still booting: wait_ready follows).
        A stopped VM holds no GPU, so a start can fail as a create does (stockout, quota). A VM
        already running is returned as it is."""
        ...

    async def delete(self, vm_id: str, zone: str) -> CloudFailure | None:
        """Deletes the VM; a VM that is already gone counts as deleted."""
        ...

    async def list_vms(self, cluster: str) -> list[CloudVm]:
        """Every VM labelled as belonging to this cluster."""
        ...

    async def health(self, vm_id: str, zone: str) -> HealthReport: ...

    async def close(self) -> None: ...
