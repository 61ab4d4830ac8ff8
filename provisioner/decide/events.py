"""What the cluster core is told: typed, immutable events, each with the time it happened. Pure data.

Requests (from the API and operators) and reports (ticks, health checks, the reconciler) stand
alone; answers name the command they answer (`answering`, the command's id), so a late, stale or
duplicate answer is recognised, and dropped, by the core alone. Every failure of a command,
whether the cloud reported it or its executor raised, is a CommandFailed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from provisioner.cloud.base import CloudFailure, HealthReport
from provisioner.config import PoolConfig
from provisioner.model.images import ImageCatalog
from provisioner.decide.reconcile import Plan
from provisioner.decide.zone_memory import ProjectQuota
from provisioner.model.records import Session, SessionSpec, Vm

# ---- requests -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CatalogChanged:
    """The image catalog was read again (new tags, a tag pointing elsewhere). Sessions keep the
    digests they were pinned to; new sessions resolve against the new catalog."""

    at: float
    catalog: ImageCatalog


@dataclass(frozen=True, slots=True)
class SessionRequested:
    """Creates the session (idempotent by request key); replies with it."""

    at: float
    spec: SessionSpec
    trace_context: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionTouched:
    at: float
    session_id: str
    user_id: str = ""


@dataclass(frozen=True, slots=True)
class BudgetSet:
    """The front's word on when the session's owner runs out of weekly GPU budget (0: never)."""
    at: float
    session_id: str
    ends_at: float


@dataclass(frozen=True, slots=True)
class BlockedUsersSet:
    """The front's list of the users blocked from GPU sessions, whole: none of theirs is requeued."""
    at: float
    user_ids: frozenset[str]


@dataclass(frozen=True, slots=True)
class ProjectQuotaTold:
    """A front relayed the project-wide GPU quota another cluster found exhausted."""
    at: float
    quota: ProjectQuota


@dataclass(frozen=True, slots=True)
class StopRequested:
    at: float
    session_id: str
    reason: str = ""
    user_id: str = ""


@dataclass(frozen=True, slots=True)
class DiscardRequested:
    """The front never acknowledged the session of request `key`; replies with it, or None."""

    at: float
    key: str
    reason: str


@dataclass(frozen=True, slots=True)
class SessionForgotten:
    """Drops an ended session from memory (its record stays in the store)."""

    at: float
    session_id: str


@dataclass(frozen=True, slots=True)
class DrainSet:
    at: float
    draining: bool


@dataclass(frozen=True, slots=True)
class PolicySet:
    """A pool's whole policy, already validated (provisioner.config.PoolConfig); replies with it."""

    at: float
    pool: str
    policy: PoolConfig


@dataclass(frozen=True, slots=True)
class PrewarmRequested:
    """Replies with the ids of the VMs that pull the image."""

    at: float
    pool: str
    image: str
    count: int


@dataclass(frozen=True, slots=True)
class EvictRequested:
    """Replies with the VM."""

    at: float
    vm_id: str
    reason: str = ""


# ---- reports ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Restored:
    """The records as the store kept them; the core re-issues the cloud work under way."""

    at: float
    sessions: tuple[Session, ...]
    vms: tuple[Vm, ...]


@dataclass(frozen=True, slots=True)
class Tick:
    at: float


@dataclass(frozen=True, slots=True)
class HealthReported:
    at: float
    vm_id: str
    report: HealthReport


@dataclass(frozen=True, slots=True)
class Reconciled:
    at: float
    plan: Plan


# ---- answers to commands --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VmCreated:
    """The cloud accepted a Launch; the VM boots (a VmReady or CommandFailed follows)."""

    at: float
    answering: int
    endpoint: str = ""


@dataclass(frozen=True, slots=True)
class VmReady:
    at: float
    answering: int
    endpoint: str = ""


@dataclass(frozen=True, slots=True)
class PullProgress:
    at: float
    answering: int
    bytes_done: int


@dataclass(frozen=True, slots=True)
class PullDone:
    at: float
    answering: int


@dataclass(frozen=True, slots=True)
class WipeDone:
    at: float
    answering: int


@dataclass(frozen=True, slots=True)
class VmDeleted:
    at: float
    answering: int


@dataclass(frozen=True, slots=True)
class VmStopped:
    """A Stop is done: the VM is stopped, its disk kept."""

    at: float
    answering: int


@dataclass(frozen=True, slots=True)
class VmStarted:
    """A Start is done: the VM runs again and its agent answers."""

    at: float
    answering: int
    endpoint: str = ""


@dataclass(frozen=True, slots=True)
class NotebookStarted:
    """A StartNotebook is done: the container runs and answers at `endpoint`."""

    at: float
    answering: int
    endpoint: str = ""


@dataclass(frozen=True, slots=True)
class NotebookStopped:
    at: float
    answering: int


@dataclass(frozen=True, slots=True)
class CommandFailed:
    """The cloud refused or failed the command, or its executor raised."""

    at: float
    answering: int
    failure: CloudFailure


Request = (SessionRequested | SessionTouched | StopRequested | DiscardRequested | SessionForgotten | DrainSet
           | PolicySet | PrewarmRequested | EvictRequested | BudgetSet)
Report = Restored | Tick | HealthReported | Reconciled | CatalogChanged | ProjectQuotaTold
Answer = (VmCreated | VmReady | PullProgress | PullDone | WipeDone | VmDeleted | VmStopped | VmStarted
          | NotebookStarted | NotebookStopped | CommandFailed)
Event = Request | Report | Answer
