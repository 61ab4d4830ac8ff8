"""Preemption: which running sessions of a pool to stop for a session within its owner's share,
in what order and why, and when a preempted session is warned and stopped. Pure: no clock, no
I/O; the same inputs in any order give the same answer.

Each user is guaranteed a share of a pool's GPUs; a session beyond its owner's share borrows idle
GPUs (`over_share`). When a session that fits within its owner's share cannot be placed, it may
take GPUs back from sessions of a preemptible class that are over their owner's share, or of a
lower rank than its own. They go in this order:

1. over their owner's share before within it;
2. the lowest rank first;
3. the owner most over their share first (GPUs held minus share);
4. the youngest first (latest start), so the least work is lost;
5. by session id, so that ties always break the same way.

Victims are taken in that order until they free the GPUs asked for; any that a later, larger one
made unnecessary is then spared (the latest in the order first), so no victim is stopped in vain.
A non-preemptible class (interactive's, always) is never taken, and a requester already over its
own share takes nothing: it waits like anyone borrowing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping, Protocol

STOP_REASON = "preempted"

Cause = Literal["over_share", "lower_priority"]


class PriorityClass(Protocol):
    """A class of the fleet config (`priority.classes`): `PriorityClassConfig` is one."""

    @property
    def rank(self) -> int: ...

    @property
    def preemptible(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Request:
    """The session waiting for GPUs."""

    owner: str
    klass: str  # its priority class
    gpus: int


@dataclass(frozen=True, slots=True)
class Running:
    """A session holding GPUs in the pool."""

    id: str
    owner: str
    klass: str
    gpus: int
    started_at: float
    over_share: bool  # beyond its owner's share: borrowed GPUs


@dataclass(frozen=True, slots=True)
class Held:
    """A session holding GPUs in the pool, before its share is looked at."""

    id: str
    owner: str
    klass: str
    gpus: int
    started_at: float


@dataclass(frozen=True, slots=True)
class Share:
    """A user's guaranteed GPUs in the pool and the GPUs the user holds there now."""

    gpus: int
    used: int

    @property
    def over_by(self) -> int:
        return self.used - self.gpus


@dataclass(frozen=True, slots=True)
class Victim:
    session_id: str
    owner: str
    gpus: int
    cause: Cause  # over its owner's share, or (within it) of a lower rank than the requester
    detail: str  # the cause with its numbers, for the session's warning and the record


@dataclass(frozen=True, slots=True)
class GracePlan:
    """What happens to a preempted session: warned at once (on its watch stream), stopped with
    reason `preempted` after the grace period, then queued again if its caller asked for that."""

    session_id: str
    warn_at: float
    stop_at: float
    requeue: bool
    detail: str


def choose_victims(request: Request, running: Iterable[Running], shares: Mapping[str, Share],
                   classes: Mapping[str, PriorityClass]) -> tuple[Victim, ...] | None:
    """The sessions to preempt for `request`, in order, or None when it may not preempt (its
    owner would go over their share) or cannot free enough (too few preemptible GPUs).
    `shares` holds the requester's owner and every running session's owner."""
    if request.gpus < 1:
        raise ValueError(f"a request needs at least one GPU, got {request.gpus}")
    running = tuple(running)
    ids = [s.id for s in running]
    if len(set(ids)) != len(ids):
        raise ValueError("running sessions must have distinct ids")
    mine = _share(shares, request.owner)
    if mine.used + request.gpus > mine.gpus:
        return None
    rank = _class(classes, request.klass).rank

    def eligible(s: Running) -> bool:
        c = _class(classes, s.klass)
        return c.preemptible and (s.over_share or c.rank < rank)

    def order(s: Running) -> tuple:
        return (not s.over_share, _class(classes, s.klass).rank, -_share(shares, s.owner).over_by,
                -s.started_at, s.id)

    chosen: list[Running] = []
    freed = 0
    for s in sorted(filter(eligible, running), key=order):
        if freed >= request.gpus:
            break
        chosen.append(s)
        freed += s.gpus
    if freed < request.gpus:
        return None
    # Spare those the last ones taken made unnecessary. Only a removal that keeps enough is made,
    # so each victim kept is needed even after the later removals (they only lower the total).
    kept = []
    for s in reversed(chosen):
        if freed - s.gpus >= request.gpus:
            freed -= s.gpus
        else:
            kept.append(s)
    return tuple(_victim(s, request, mine, shares, classes) for s in reversed(kept))


def mark_over_share(held: Iterable[Held], share_gpus: int, classes: Mapping[str, PriorityClass],
                    ahead: Mapping[str, int] | None = None) -> tuple[Running, ...]:
    """Which of each user's sessions run over the user's share: those of a class that is never
    preempted fill the share first, then the oldest; a session is over share once the GPUs
    counted before it and its own exceed the share. `ahead`: GPUs each owner holds in sessions
    left out of `held`, all of never-preempted classes (they count first). In id order."""
    by_owner: dict[str, list[Held]] = {}
    for h in held:
        by_owner.setdefault(h.owner, []).append(h)
    ahead = ahead or {}
    out = []
    for owner, sessions in by_owner.items():
        sessions.sort(key=lambda h: (_class(classes, h.klass).preemptible, h.started_at, h.id))
        counted = ahead.get(owner, 0)
        for h in sessions:
            counted += h.gpus
            out.append(Running(h.id, h.owner, h.klass, h.gpus, h.started_at, counted > share_gpus))
    return tuple(sorted(out, key=lambda r: r.id))


def grace_plan(victim: Victim, decided_at: float, grace_period_s: float, requeue: bool) -> GracePlan:
    """The warning and the stop of a session preempted at `decided_at`; `requeue` is what its
    caller asked for when creating it."""
    if not math.isfinite(grace_period_s) or grace_period_s < 0:
        raise ValueError(f"grace_period_s must be a finite number >= 0, got {grace_period_s}")
    return GracePlan(victim.session_id, decided_at, decided_at + grace_period_s, requeue, victim.detail)


def _share(shares: Mapping[str, Share], owner: str) -> Share:
    try:
        return shares[owner]
    except KeyError:
        raise ValueError(f"no share given for user {owner!r}") from None


def _class(classes: Mapping[str, PriorityClass], name: str) -> PriorityClass:
    try:
        return classes[name]
    except KeyError:
        raise ValueError(f"unknown priority class {name!r}; classes: {', '.join(sorted(classes))}") from None


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _victim(s: Running, request: Request, mine: Share, shares: Mapping[str, Share],
            classes: Mapping[str, PriorityClass]) -> Victim:
    theirs, c = _share(shares, s.owner), _class(classes, s.klass)
    if s.over_share:
        cause: Cause = "over_share"
        why = f"over its owner's share ({s.owner} holds {_gpus(theirs.used)} of a {theirs.gpus}-GPU share)"
    else:
        cause = "lower_priority"
        why = f"class {s.klass} (rank {c.rank}) below {request.klass} (rank {classes[request.klass].rank})"
    return Victim(s.id, s.owner, s.gpus, cause,
                  f"{s.klass} session {s.id} started at {s.started_at:g}, {why}: frees {_gpus(s.gpus)} for "
                  f"{request.owner}'s {request.klass} session within their share "
                  f"({mine.used} + {request.gpus} of {_gpus(mine.gpus)})")
