"""What the cluster core asks of its shell: commands for the cloud, and the Step that carries them
with the records to persist. Pure data.

Every command carries an id, unique within the core's life (see ClusterCore.handle); each answer
event names the id of the command it answers, so the core alone decides whether it still applies.
`session_id` links the work to the request's trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from provisioner.model.images import Layer
from provisioner.model.records import Session, Vm


@dataclass(frozen=True, slots=True)
class Launch:
    id: int
    vm_id: str
    pool: str
    zone: str
    images: tuple[str, ...] = ()
    session_id: str = ""
    spot: bool = False  # a Spot VM (a Spot pool's, or its Spot tier's)


@dataclass(frozen=True, slots=True)
class Pull:
    id: int
    vm_id: str
    zone: str
    image: str
    layers: tuple[Layer, ...]
    session_id: str = ""
    # What to pull: `repository@digest` (the session's pinned digest, or the catalog's for a
    # prewarm). `layers` are those the VM lacks, for accounting and progress.
    digest: str = ""
    repository: str = ""


@dataclass(frozen=True, slots=True)
class Wipe:
    id: int
    vm_id: str
    zone: str
    session_id: str = ""


@dataclass(frozen=True, slots=True)
class Delete:
    id: int
    vm_id: str
    zone: str
    session_id: str = ""


@dataclass(frozen=True, slots=True)
class Stop:
    """Stops an idle warm VM into standby: its disk, so its image cache, is kept."""

    id: int
    vm_id: str
    zone: str
    session_id: str = ""


@dataclass(frozen=True, slots=True)
class Start:
    """Starts a standby VM (for `session_id`, or to refill the warm pool)."""

    id: int
    vm_id: str
    pool: str
    zone: str
    session_id: str = ""


@dataclass(frozen=True, slots=True)
class StartNotebook:
    """Runs the session's notebook container on its VM, once the VM holds the image: answered
    when its endpoint answers (NotebookStarted, with the endpoint) or with the runtime's reason."""

    id: int
    vm_id: str
    zone: str
    session_id: str
    user: str
    image: str
    digest: str = ""  # `repository@digest`: the digest the session was pinned to at creation
    repository: str = ""


@dataclass(frozen=True, slots=True)
class StopNotebook:
    """Ends the session's notebook container (SIGTERM, a grace period, SIGKILL) before the VM
    is wiped or deleted."""

    id: int
    vm_id: str
    zone: str
    session_id: str


Command = Launch | Pull | Wipe | Delete | Stop | Start | StartNotebook | StopNotebook


@dataclass(slots=True)
class Step:
    """The outcome of handling events: commands to run, records to write (before acting on them,
    and to tell watchers), and the answer to the last request among the events, if any. The
    records, and a reply that is one, are frozen values as of this step (decide/changes.py): a
    writer or watcher holding them never sees a later change."""

    commands: list[Command] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    vms: list[Vm] = field(default_factory=list)
    reply: object = None
    # Queued sessions whose place in the queue alone moved: told to watchers, not written (the
    # place is a live value, numbered again on restore; a move is not a change of the record).
    moved: list[Session] = field(default_factory=list)
