"""Sessions and VMs as the cluster core keeps them. Plain data plus guarded state changes."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum

from provisioner.model.abuse_record import Decision
from provisioner.model.images import LayerCache
from provisioner.model.states import (
    SESSION_TRANSITIONS,
    VM_TRANSITIONS,
    SessionState,
    StateChange,
    VmState,
    check_transition,
)


class SessionKind(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class StartKind(StrEnum):
    WARM = "warm"
    PARTIAL = "partial"
    COLD = "cold"


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """A validated request. `image` is as asked ("gpu:latest"); the session records the version."""

    request_id: str
    user_id: str
    accelerator: str
    image: str
    kind: SessionKind = SessionKind.INTERACTIVE
    notebook_id: str = ""
    region_hint: str = ""
    region_required: bool = False
    max_runtime_s: float = 0.0  # 0: the cluster default
    priority_class: str = ""  # "": the class of its kind (priority.kinds)
    requeue: bool = False  # if preempted, queue a new session with this spec in its place

    @property
    def key(self) -> str:
        """The idempotency key: request ids are scoped by user, so another user's request id
        never finds this session."""
        return request_key(self.user_id, self.request_id)


def request_key(user_id: str, request_id: str) -> str:
    # User ids never contain "/" (api/limits), so the key splits back unambiguously.
    return f"{user_id}/{request_id}"


def created_ns(seconds: float) -> int:
    """A creation time as the API gives it (whole nanoseconds, truncated), which orders lists."""
    return int(seconds * 1e9)


def split_request_key(key: str) -> tuple[str, str]:
    """(user id, request id) of a key made by request_key."""
    user_id, _, request_id = key.partition("/")
    return user_id, request_id


def cluster_of(session_id: str) -> str:
    """The cluster a session id names (`us-central1.s-...`); "" if it names none."""
    return session_id.split(".", 1)[0] if "." in session_id else ""


@dataclass(frozen=True, slots=True)
class Notice:
    """A warning to a session's watchers before something happens to it."""

    kind: str  # what it is about: "gpu_budget"
    message: str
    time: float  # when it was given
    action_time: float  # when what it warns of is due


@dataclass(slots=True)
class Session:
    id: str
    spec: SessionSpec
    cluster: str
    pool: str
    image: str  # the resolved version (a tag)
    created_at: float
    idle_timeout_s: float
    max_runtime_s: float
    state: SessionState | None = None
    reason: str = ""
    start: StartKind | None = None
    vm_id: str = ""
    endpoint: str = ""
    queue_position: int = 0
    estimated_ready_at: float = 0.0
    pull_bytes_total: int = 0
    pull_bytes_done: int = 0
    ready_at: float = 0.0
    ended_at: float = 0.0
    last_activity_at: float = 0.0
    history: list[StateChange] = field(default_factory=list)
    revision: int = 0
    # W3C trace context of the request that created it, so later work joins the same trace.
    trace_context: dict[str, str] = field(default_factory=dict)
    # When the owner's weekly GPU budget runs out (0: not known to), as the front last said, and
    # the warnings its watchers were given.
    budget_ends_at: float = 0.0
    notices: list[Notice] = field(default_factory=list)
    # Its priority class, resolved at creation (decide/preemption_rules.py). While preempted and not yet
    # stopped: when its grace period ends and the session it makes room for.
    priority_class: str = ""
    preempt_at: float = 0.0
    preempted_for: str = ""
    # A preempted session queued again as a new session (spec.requeue), and the other way.
    requeued_as: str = ""
    requeued_from: str = ""
    # Abuse detection flagged it (provisioner/decide/abuse_watch.py): the record every front applies.
    abuse: Decision | None = None
    # The manifest digest `image` named at creation: what the session runs for its whole life,
    # whatever the tag names later.
    image_digest: str = ""
    # The session's secret: its notebook server admits only requests presenting it. Shown to
    # its owner, service and admin callers by GetSession alone (api/convert.py).
    access_token: str = field(default="", repr=False)  # out of repr, so out of any log line

    def to(self, state: SessionState, reason: str, now: float) -> None:
        check_transition(SESSION_TRANSITIONS, "session", self.id, self.state, state)
        self.state = state
        self.reason = reason
        self.history.append(StateChange(state.value, reason, now))
        if state is not SessionState.QUEUED:
            self.queue_position = 0

    @property
    def terminal(self) -> bool:
        return self.state in (SessionState.STOPPED, SessionState.FAILED)

    def to_dict(self) -> dict:
        # By hand rather than dataclasses.asdict, which deep-copies and costs five times as much:
        # this runs for every changed session on every store write.
        d = {name: getattr(self, name) for name in _SESSION_FIELDS}
        d["spec"] = {name: getattr(self.spec, name) for name in _SPEC_FIELDS}
        d["history"] = [[h.state, h.reason, h.time] for h in self.history]
        d["trace_context"] = dict(self.trace_context)
        d["notices"] = [[n.kind, n.message, n.time, n.action_time] for n in self.notices]
        d["abuse"] = self.abuse.to_list() if self.abuse else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Session:
        d = dict(d)
        d.pop("discarded", None)  # written by older releases, which erased discarded sessions
        spec = dict(d.pop("spec"))
        spec["kind"] = SessionKind(spec["kind"])
        d["spec"] = SessionSpec(**spec)
        d["state"] = SessionState(d["state"]) if d["state"] else None
        d["start"] = StartKind(d["start"]) if d["start"] else None
        d["history"] = [StateChange(*h) for h in d["history"]]
        d["notices"] = [Notice(*n) for n in d.get("notices", ())]  # older records have none
        d["abuse"] = Decision.from_list(d["abuse"]) if d.get("abuse") else None  # nor this
        return cls(**d)


_SESSION_FIELDS = tuple(f.name for f in fields(Session))
_SPEC_FIELDS = tuple(f.name for f in fields(SessionSpec))


@dataclass(slots=True)
class Vm:
    id: str
    cluster: str
    pool: str
    zone: str
    cache: LayerCache
    created_at: float
    state: VmState | None = None
    reason: str = ""
    session_id: str = ""
    # A session waiting for this VM while it is created (cold start).
    reserved_for: str = ""
    endpoint: str = ""
    healthy: bool = True
    health_detail: str = ""
    # Image version being pulled onto the VM, if any.
    pulling: str = ""
    warm_since: float = 0.0
    history: list[StateChange] = field(default_factory=list)
    revision: int = 0

    def to(self, state: VmState, reason: str, now: float) -> None:
        check_transition(VM_TRANSITIONS, "vm", self.id, self.state, state)
        self.state = state
        self.reason = reason
        self.history.append(StateChange(state.value, reason, now))
        if state is VmState.WARM:
            self.warm_since = now

    def to_dict(self) -> dict:
        return {
            "id": self.id, "cluster": self.cluster, "pool": self.pool, "zone": self.zone,
            "cache": self.cache.to_dict(), "created_at": self.created_at,
            "state": self.state.value if self.state else None, "reason": self.reason,
            "session_id": self.session_id, "reserved_for": self.reserved_for,
            "endpoint": self.endpoint, "healthy": self.healthy, "health_detail": self.health_detail,
            "pulling": self.pulling, "warm_since": self.warm_since,
            "history": [[h.state, h.reason, h.time] for h in self.history], "revision": self.revision,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Vm:
        d = dict(d)
        d["cache"] = LayerCache.from_dict(d["cache"])
        d["state"] = VmState(d["state"]) if d["state"] else None
        d["history"] = [StateChange(*h) for h in d["history"]]
        return cls(**d)
