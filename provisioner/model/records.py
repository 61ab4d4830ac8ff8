"""Sessions and VMs as the cluster core keeps them. Plain data plus guarded state changes.

The core changes its own records in place; what leaves it (a Step's records, its reads, its
replies) is a frozen value as of the step (`frozen_session`, `frozen_vm`): a FrozenSession or
FrozenVm, read like a record, equal to a record with the same fields, and unchangeable.
"""

from __future__ import annotations

from collections import namedtuple
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
    spot: bool = False  # a Spot VM: the cloud may take it back at any time

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
            "spot": self.spot,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Vm:
        d = dict(d)
        d["cache"] = LayerCache.from_dict(d["cache"])
        d["state"] = VmState(d["state"]) if d["state"] else None
        d["history"] = [StateChange(*h) for h in d["history"]]
        return cls(**d)


_VM_FIELDS = tuple(f.name for f in fields(Vm))


class FrozenList(list):
    """A copy of a list that refuses changes: a frozen record's history and notices (a list still,
    so it compares equal to the record's own). Copied, not viewed: measured in instructions on a
    replay, a list copy costs less than making a view in Python."""

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("a frozen record's list cannot change")

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse


NO_NOTICES = FrozenList()


def _same_fields(names: tuple[str, ...], record: type):
    def __eq__(self, other) -> bool:
        if not isinstance(other, (type(self), record)):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in names)
    return __eq__


def _fields_repr(names: tuple[str, ...]):
    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"
    return __repr__


class FrozenSession(namedtuple("SessionFields", _SESSION_FIELDS)):
    """A session as it was at one step: its fields read as a Session's, none can change. A
    tuple underneath, because a tuple is made in one call: the core makes one for every session
    each step changes."""

    __slots__ = ()
    terminal = Session.terminal
    to_dict = Session.to_dict
    __eq__ = _same_fields(_SESSION_FIELDS, Session)
    __ne__ = lambda self, other: not self == other  # noqa: E731
    __hash__ = None
    __repr__ = _fields_repr(tuple(f.name for f in fields(Session) if f.repr))  # no access token in a log line


class FrozenVm(namedtuple("VmFields", _VM_FIELDS)):
    """A VM as it was at one step: its fields read as a Vm's, none can change (its cache too)."""

    __slots__ = ()
    to_dict = Vm.to_dict
    __eq__ = _same_fields(_VM_FIELDS, Vm)
    __ne__ = lambda self, other: not self == other  # noqa: E731
    __hash__ = None
    __repr__ = _fields_repr(_VM_FIELDS)


def _generated(name: str, source: str):
    scope = {"new": tuple.__new__, "make": object.__new__, "put": object.__setattr__,
             "FrozenList": FrozenList, "NO_NOTICES": NO_NOTICES,
             "FrozenSession": FrozenSession, "FrozenVm": FrozenVm, "Session": Session, "Vm": Vm}
    exec(source, scope)  # noqa: S102 - source built below from the dataclasses' own field names
    return scope[name]


def _freezer(name: str, into: str, names: tuple[str, ...], converted: dict[str, str]):
    """A function making the frozen value of a record: one tuple, built in one expression."""
    values = ", ".join(converted[n].format(f"r.{n}") if n in converted else f"r.{n}" for n in names)
    return _generated(name, f"def {name}(r):\n    return new({into}, ({values}))\n")


def _copier(name: str, into: str, names: tuple[str, ...], converted: dict[str, str]):
    """A function making a record of the core's own from any record or frozen value."""
    lines = [f"def {name}(r):", f"    c = make({into})"]
    lines += [f"    put(c, {n!r}, {converted[n].format(f'r.{n}') if n in converted else f'r.{n}'})" for n in names]
    return _generated(name, "\n".join([*lines, "    return c", ""]))


# What leaves the core: frozen values, their lists and cache frozen too.
frozen_session = _freezer("frozen_session", "FrozenSession", _SESSION_FIELDS,
                          {"history": "FrozenList({0})", "notices": "(FrozenList({0}) if {0} else NO_NOTICES)"})
frozen_vm = _freezer("frozen_vm", "FrozenVm", _VM_FIELDS, {"history": "FrozenList({0})", "cache": "{0}.frozen()"})
# What the core takes in (restored from the store, or another core's values): records of its own.
session_copy = _copier("session_copy", "Session", _SESSION_FIELDS,
                       {"history": "list({0})", "notices": "list({0})", "trace_context": "dict({0})"})
vm_copy = _copier("vm_copy", "Vm", _VM_FIELDS, {"history": "list({0})", "cache": "{0}.copy()"})
