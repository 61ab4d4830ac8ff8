"""Sessions and quotas as plain dataclasses, with enums instead of the protos' numbers."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from provisioner.v1 import types_pb2


class _ProtoEnum(enum.Enum):
    """An enum whose values are the proto names without their prefix, lower case."""

    @classmethod
    def _from_pb(cls, proto_enum, number: int):
        if number == 0:
            return None
        try:
            name = proto_enum.Name(number)
        except ValueError:  # a newer server's value
            return None
        return cls(name.removeprefix(proto_enum.Name(0).removesuffix("UNSPECIFIED")).lower())

    def _to_pb(self, proto_enum) -> int:
        return proto_enum.Value(proto_enum.Name(0).removesuffix("UNSPECIFIED") + self.value.upper())

    def __str__(self) -> str:
        return self.value


class SessionState(_ProtoEnum):
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    PULLING_IMAGE = "pulling_image"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def pending(self) -> bool:
        """Not running yet, but on its way."""
        return self in (SessionState.QUEUED, SessionState.PROVISIONING, SessionState.PULLING_IMAGE)

    @property
    def ended(self) -> bool:
        return self in (SessionState.STOPPED, SessionState.FAILED)


class SessionKind(_ProtoEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class StartKind(_ProtoEnum):
    WARM = "warm"  # a warm VM held the exact image
    PARTIAL = "partial"  # a warm VM pulled the layers it lacked
    COLD = "cold"  # a new VM


def _time(msg, field: str) -> datetime | None:
    return getattr(msg, field).ToDatetime(tzinfo=timezone.utc) if msg.HasField(field) else None


def _duration(msg, field: str) -> timedelta | None:
    return getattr(msg, field).ToTimedelta() if msg.HasField(field) else None


@dataclass(frozen=True)
class StateChange:
    state: str
    reason: str
    time: datetime | None


@dataclass(frozen=True)
class Notice:
    """A warning to a session's watchers, e.g. kind "gpu_budget": the owner's weekly GPU budget
    runs out at `action_time`, when the session is stopped."""

    kind: str
    message: str
    time: datetime | None
    action_time: datetime | None


@dataclass(frozen=True)
class Pull:
    """An image pull: the bytes this VM lacked and how many have arrived."""

    bytes_total: int
    bytes_done: int

    @property
    def fraction(self) -> float:
        return min(1.0, self.bytes_done / self.bytes_total) if self.bytes_total > 0 else 0.0


@dataclass(frozen=True)
class Session:
    """A session as the server last reported it. Times are the serving cluster's clock (a
    simulated fleet's runs ahead of the wall); `read_time` is that clock when it answered."""

    id: str
    state: SessionState | None
    reason: str
    user_id: str
    accelerator: str
    image: str  # the exact version it runs (`gpu:latest` resolved at creation)
    image_requested: str
    kind: SessionKind | None
    notebook_id: str
    request_id: str
    cluster: str
    pool: str
    vm_id: str
    endpoint: str
    start: StartKind | None
    queue_position: int
    estimated_ready_time: datetime | None
    pull: Pull | None
    create_time: datetime | None
    ready_time: datetime | None
    end_time: datetime | None
    last_activity_time: datetime | None
    idle_timeout: timedelta | None
    max_runtime: timedelta | None
    history: tuple[StateChange, ...]
    revision: int
    read_time: datetime | None
    notices: tuple[Notice, ...] = ()  # warnings ahead of an action on it, oldest first
    budget_end_time: datetime | None = None  # the owner's weekly GPU budget runs out (it stops then)
    priority_class: str = ""  # the class it runs in
    preemption_time: datetime | None = None  # preempted: it stops then, with reason "preempted"
    requeued_as: str = ""  # preempted and queued again as this session
    requeued_from: str = ""  # queued in place of this preempted session
    image_digest: str = ""  # the manifest digest `image` named at creation: what it runs for life
    # The session's secret (get_session only, for its owner and service or admin callers): the
    # notebook server admits only requests presenting it. Kept out of repr, so out of logs.
    access_token: str = field(default="", repr=False)

    @classmethod
    def from_proto(cls, s: types_pb2.Session) -> Session:
        return cls(
            id=s.id, state=SessionState._from_pb(types_pb2.SessionState, s.state), reason=s.reason,
            user_id=s.spec.user_id, accelerator=s.spec.accelerator, image=s.image or s.spec.image,
            image_requested=s.spec.image, kind=SessionKind._from_pb(types_pb2.SessionKind, s.spec.kind),
            notebook_id=s.spec.notebook_id, request_id=s.spec.request_id, cluster=s.cluster,
            pool=s.pool, vm_id=s.vm_id, endpoint=s.endpoint,
            start=StartKind._from_pb(types_pb2.StartKind, s.start), queue_position=s.queue_position,
            estimated_ready_time=_time(s, "estimated_ready_time"),
            pull=Pull(s.pull.bytes_total, s.pull.bytes_done) if s.HasField("pull") else None,
            create_time=_time(s, "create_time"), ready_time=_time(s, "ready_time"),
            end_time=_time(s, "end_time"), last_activity_time=_time(s, "last_activity_time"),
            idle_timeout=_duration(s, "idle_timeout"), max_runtime=_duration(s, "max_runtime"),
            history=tuple(StateChange(h.state, h.reason, _time(h, "time")) for h in s.history),
            revision=s.revision, read_time=_time(s, "read_time"),
            notices=tuple(Notice(n.kind, n.message, _time(n, "time"), _time(n, "action_time")) for n in s.notices),
            budget_end_time=_time(s, "budget_end_time"), priority_class=s.priority_class,
            preemption_time=_time(s, "preemption_time"), requeued_as=s.requeued_as, requeued_from=s.requeued_from,
            image_digest=s.image_digest, access_token=s.access_token,
        )

    @property
    def ready_in(self) -> timedelta | None:
        """The estimated wait until running, on the server's clock; None if not waiting."""
        if self.state is None or not self.state.pending or self.estimated_ready_time is None:
            return None
        now = self.read_time or datetime.now(timezone.utc)
        return max(timedelta(0), self.estimated_ready_time - now)

    @property
    def progress(self) -> str:
        """One line for a person: state, queue position, pull, estimate (server time), reason."""
        parts = [str(self.state or "unknown")]
        if self.queue_position:
            parts.append(f"queue #{self.queue_position}")
        if self.pull is not None and self.state is SessionState.PULLING_IMAGE:
            parts.append(f"pull {self.pull.fraction:.0%} of {self.pull.bytes_total / 1e9:.1f} GB")
        if self.ready_in is not None:
            parts.append(f"ready in ~{round(self.ready_in.total_seconds())}s")
        return " ".join(parts) + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class Quota:
    user_id: str
    gpu_hours_limit: float
    gpu_hours_used: float
    reset_time: datetime | None
    max_active_sessions: int  # interactive
    active_sessions: int  # interactive
    gpu_hours_left: float = 0.0
    max_active_batch_sessions: int = 0
    active_batch_sessions: int = 0

    @classmethod
    def from_proto(cls, q: types_pb2.Quota) -> Quota:
        return cls(q.user_id, q.gpu_hours_limit, q.gpu_hours_used, _time(q, "reset_time"),
                   q.max_active_sessions, q.active_sessions, q.gpu_hours_left, q.max_active_batch_sessions,
                   q.active_batch_sessions)
