"""The front's placement protocol as a state machine, without I/O.

An attempt is one request key at one cluster; its state is a row of the front's store. The table
below is the specification: every change of an attempt's state is one of its edges, the store
applies a change only if the row is still in the state the change starts from, and nothing else
writes an attempt's state.

`PlacementRun` decides, for one CreateSession, what to do next from what just happened and the
time (`handle(event, now) -> action`); `ResolveRun` does the same for the resolver at one
unsettled attempt. `front/placement.py` carries the actions out (store, gRPC, breaker, tracing)
and feeds their outcomes back as events.

A request's first attempt claims it (store/schema.py): the placement that made it may answer with
the session its cluster made there before recording it as the request's answer (one durable write
before the answer, not two), since no other session can be recorded while that attempt may have
made one. Moving on from that cluster, it waives the claim in the same write that settles the
attempt. Every other placement records before it answers, as the resolver does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable

# Longest single attempt at one cluster, so a stuck cluster leaves time to try another.
ATTEMPT_TIMEOUT_S = 5.0
# An attempt with another candidate after it is shorter: a live cluster answers an Allocate in tens
# of milliseconds (a max of 50 ms in the serving benchmark), and one that is frozen (SIGSTOP, a
# stalled host) is noticed by keepalives only after seconds. So a create sent there moves on after
# this, and asks ASK_TIMEOUT_S at most whether the session was made before leaving the attempt
# open for the resolver: about 3 s lost, not 10, and a caller's deadline of a few seconds holds.
# Nothing else changes: commit_by is the attempt's end, which the cluster honours, as always.
ATTEMPT_BEFORE_FALLBACK_S = 2.0
ASK_TIMEOUT_S = 1.0
# commit_by is judged by the cluster's clock; this is how far apart the two may be.
CLOCK_SKEW_S = 1.0
# Tries of an Allocate at one cluster when the outcome is ambiguous, and their backoff.
TRIES = 3
BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
# A record held back by the request's claim is tried again this many times, waiting this much
# longer each time: the claim's placement records its answer within milliseconds, unless it died.
HELD_TRIES = 3
HELD_WAIT_S = 0.05
# Below this, an attempt or a question is not worth starting.
MIN_BUDGET_S = 0.05
MIN_TIMEOUT_S = 0.01


class Attempt(StrEnum):
    PENDING = "pending"        # written down; an Allocate in flight, outcome unknown
    UNRESOLVED = "unresolved"  # no answer: asked again once commit_by has passed
    REFUSED = "refused"        # answered no; final once commit_by has passed
    MADE = "made"              # the cluster made the session that is the request's answer
    NONE = "none"              # the cluster made nothing, or what it made was discarded


class Event(StrEnum):
    SENT = "sent"              # an Allocate is about to go, carrying commit_by
    WON = "won"                # its session was recorded as the request's answer
    REFUSED = "refused"        # the cluster answered that it made nothing
    NO_ANSWER = "no answer"    # no answer after the tries, and the cluster did not find it
    NOT_FOUND = "not found"    # past commit_by (and the skew) the cluster has nothing for it
    DISCARDED = "discarded"    # a duplicate of a session placed elsewhere, discarded


# Unsettled: the resolver looks at these once commit_by has passed. Sticky: a retry of the request
# goes to these clusters first, as an Allocate there may have made the session.
UNSETTLED = frozenset({Attempt.PENDING, Attempt.UNRESOLVED, Attempt.REFUSED})
STICKY = frozenset({Attempt.PENDING, Attempt.UNRESOLVED})
SETTLED = frozenset({Attempt.MADE, Attempt.NONE})

# (state before, event) -> state after. None: no attempt at that cluster yet.
# Only the cluster's answer after commit_by, or a discard, settles an attempt as NONE: until then
# any copy of an Allocate still on its way (a delayed or duplicated request, an earlier try,
# another replica's or a restarted front's) may make the session, and a refusal cannot know that.
TRANSITIONS: dict[tuple[Attempt | None, Event], Attempt] = {
    # Written before the Allocate is sent, so an outcome never heard is looked up, not guessed.
    (None, Event.SENT): Attempt.PENDING,
    # Again at the same cluster (a client's retry, another replica): Allocate is idempotent by
    # request key; the later commit_by is kept, so the resolver waits for every copy.
    (Attempt.PENDING, Event.SENT): Attempt.PENDING,
    (Attempt.UNRESOLVED, Event.SENT): Attempt.PENDING,
    (Attempt.REFUSED, Event.SENT): Attempt.PENDING,
    (Attempt.NONE, Event.SENT): Attempt.PENDING,
    # Every Allocate of the request at that cluster gives this session.
    (Attempt.PENDING, Event.WON): Attempt.MADE,
    (Attempt.UNRESOLVED, Event.WON): Attempt.MADE,  # adopted by the resolver, or another front found it
    (Attempt.REFUSED, Event.WON): Attempt.MADE,     # a later copy of the Allocate made it
    (Attempt.PENDING, Event.REFUSED): Attempt.REFUSED,
    (Attempt.PENDING, Event.NO_ANSWER): Attempt.UNRESOLVED,
    # After commit_by the cluster makes nothing for an unknown request: "not found" is final.
    (Attempt.PENDING, Event.NOT_FOUND): Attempt.NONE,  # the front that sent it stopped
    (Attempt.UNRESOLVED, Event.NOT_FOUND): Attempt.NONE,
    (Attempt.REFUSED, Event.NOT_FOUND): Attempt.NONE,
    # The cluster keeps the request key of a discarded session, so it makes no other for it.
    (Attempt.PENDING, Event.DISCARDED): Attempt.NONE,
    (Attempt.UNRESOLVED, Event.DISCARDED): Attempt.NONE,
    (Attempt.REFUSED, Event.DISCARDED): Attempt.NONE,
}


class IllegalAttemptChange(Exception):
    pass


def transition(state: Attempt | None, event: Event) -> Attempt:
    """The state after `event`, by the table; an edge the table lacks raises."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise IllegalAttemptChange(f"attempt {state or 'absent'}: {event} is not a transition") from None


def check_change(before: Attempt | None, after: Attempt) -> None:
    """Raises unless some event takes `before` to `after` (what the store is asked to apply)."""
    if not any(b == before and a == after for (b, _), a in TRANSITIONS.items()):
        raise IllegalAttemptChange(f"attempt {before or 'absent'} -> {after} is not a transition")


def sources(event: Event) -> dict[Attempt | None, Attempt]:
    """state before -> state after, for every edge of `event`."""
    return {b: a for (b, e), a in TRANSITIONS.items() if e is event}


def sticky_first(open_at: set[str] | frozenset[str], candidates: list[str]) -> list[str]:
    """Clusters where an earlier attempt's outcome is unknown come first: asking there again is
    idempotent, asking elsewhere could make a second session. Rank order is kept within each."""
    return sorted(candidates, key=lambda c: c not in open_at)


def backoff(try_no: int, rng: random.Random) -> float:
    """Exponential backoff with full jitter before try `try_no` (2, 3, ...), as front/retry.py's."""
    return rng.uniform(0, min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (try_no - 2)))


# ---- events: what the shell saw -------------------------------------------------------------

@dataclass(frozen=True)
class Start:
    pass


@dataclass(frozen=True)
class Recorded:
    state: Attempt  # the attempt's state after SENT; MADE if another front placed it here already
    first: bool = False  # the request's first attempt: this run holds its claim


@dataclass(frozen=True)
class Allocated:
    session_id: str
    session: object = None  # what the shell returns to its caller, opaque here


@dataclass(frozen=True)
class Refused:
    """The cluster answered and made nothing (no capacity, draining, past commit_by)."""
    error: Exception


@dataclass(frozen=True)
class Invalid:
    """The request itself is wrong: another cluster would say the same."""
    error: Exception


@dataclass(frozen=True)
class NoReply:
    """Unreachable, timed out, or the reply was lost: it may or may not have been made."""
    error: Exception


@dataclass(frozen=True)
class Found:
    session_id: str
    session: object = None


@dataclass(frozen=True)
class NotFound:
    pass


@dataclass(frozen=True)
class Settled:
    applied: bool  # False: someone else changed the attempt first, and theirs stands


@dataclass(frozen=True)
class Remembered:
    winner: str | None  # the request's answer, whoever recorded it; None: the claim holds it back


@dataclass(frozen=True)
class Discarded:
    ok: bool


@dataclass(frozen=True)
class Fetched:
    session: object


# ---- actions: what the shell does next ------------------------------------------------------

@dataclass(frozen=True)
class Record:
    cluster: str
    commit_by: float


@dataclass(frozen=True)
class Send:
    cluster: str
    commit_by: float
    timeout: float
    try_no: int
    wait_s: float = 0.0  # backoff before sending


@dataclass(frozen=True)
class Ask:
    cluster: str
    timeout: float


@dataclass(frozen=True)
class Settle:
    cluster: str
    expected: Attempt
    event: Event
    to: Attempt
    commit_by: float | None = None  # with `expected`, the version of the row decided on
    outcome: str = ""  # for metrics and the trace: refused, unresolved, discarded...
    waive: bool = False  # the claim's placement moves on from its cluster without answering


@dataclass(frozen=True)
class Remember:
    cluster: str
    session_id: str
    wait_s: float = 0.0  # before writing: held back by the claim, waiting for its record


@dataclass(frozen=True)
class Discard:
    cluster: str
    winner: str


@dataclass(frozen=True)
class FetchWinner:
    session_id: str | None  # None: the store knows it


@dataclass(frozen=True)
class Done:
    session: object
    outcome: str  # placed, duplicate (another front's session)
    then: Remember | None = None  # answered first (the claim's), recorded after


@dataclass(frozen=True)
class GiveUp:
    error: Exception | None  # the last cluster's answer; None: nothing could be tried in time
    outcome: str  # failed, invalid, held (by the request's claim, for its first placement)


Action = Record | Send | Ask | Settle | Remember | Discard | FetchWinner | Done | GiveUp


@dataclass
class PlacementRun:
    """One CreateSession's placement: candidates tried one at a time, best first, within
    `deadline` (the clock's time). Feed it events with the time; it answers with the next action."""

    candidates: list[str]
    deadline: float
    rng: random.Random = field(default_factory=random.Random)
    i: int = -1
    cluster: str = ""
    commit_by: float = 0.0
    state: Attempt | None = None  # of the current attempt, as this run left it
    claimed: bool = False  # holds the request's claim, at the current cluster, not waived
    held: int = 0  # records of this run held back by the claim
    try_no: int = 0
    ambiguous: Exception | None = None  # an earlier try at this cluster had no answer
    session_id: str = ""
    session: object = None
    winner: str = ""
    last: Exception | None = None
    after_settle: Callable[[float], Action] | None = None

    def handle(self, event, now: float) -> Action:
        match event:
            case Start():
                return self._next_cluster(now)
            case Recorded(state=Attempt.MADE):
                return FetchWinner(None)  # another front placed the request here meanwhile
            case Recorded(state=state, first=first):
                self.state, self.claimed = state, first
                return self._send(now)
            case Allocated(session_id=sid, session=s) if self.claimed:
                # Nothing else can be recorded while this attempt may have made a session.
                return Done(s, "placed", then=Remember(self.cluster, sid))
            case Allocated(session_id=sid, session=s) | Found(session_id=sid, session=s):
                self.session_id, self.session = sid, s
                return Remember(self.cluster, sid)
            case Refused(error=err):
                self.last = err
                # An earlier try went unanswered and may have made it: come back here first.
                ev = Event.NO_ANSWER if self.ambiguous is not None else Event.REFUSED
                return self._settle(ev, "refused", self._next_cluster)
            case Invalid(error=err):
                return GiveUp(err, "invalid")
            case NoReply(error=err):
                self.ambiguous = self.last = err
                if self.try_no < TRIES and now < min(self.commit_by, self.deadline):
                    return self._send(now, wait_s=backoff(self.try_no + 1, self.rng))
                # Ask before moving on: the cluster may have made it and only the reply was lost.
                timeout = min(ASK_TIMEOUT_S if self._fallback() else ATTEMPT_TIMEOUT_S, self.deadline - now)
                if timeout <= MIN_TIMEOUT_S:
                    return self.handle(NotFound(), now)
                return Ask(self.cluster, timeout)
            case NotFound():
                # "Not found" is final only after commit_by: the resolver asks again then.
                return self._settle(Event.NO_ANSWER, "unresolved", self._next_cluster)
            case Remembered(winner=w) if w == self.session_id:
                return Done(self.session, "placed")  # WON applied with the record, in one write
            case Remembered(winner=None) if self.held < HELD_TRIES and now + HELD_WAIT_S * (self.held + 1) < self.deadline:
                # The request's first placement, elsewhere, may have answered: its record is due.
                self.held += 1
                return Remember(self.cluster, self.session_id, wait_s=HELD_WAIT_S * self.held)
            case Remembered(winner=None):
                # Not yet: left open here for the resolver, which discards it or, if that first
                # attempt made nothing, adopts it.
                return GiveUp(None, "held")
            case Remembered(winner=w):
                self.winner = w  # another front replica placed it first
                return Discard(self.cluster, w)
            case Discarded(ok=True):
                return self._settle(Event.DISCARDED, "duplicate", lambda now: FetchWinner(self.winner))
            case Discarded(ok=False):
                return FetchWinner(self.winner)  # the attempt stays open: the resolver discards it
            case Settled():
                then, self.after_settle = self.after_settle, None
                return then(now)
            case Fetched(session=s):
                return Done(s, "duplicate")
        raise IllegalAttemptChange(f"placement: unexpected {event!r}")

    def _settle(self, event: Event, outcome: str, then) -> Action:
        to = transition(self.state, event)
        self.after_settle = then
        waive, self.claimed = self.claimed, False
        return Settle(self.cluster, self.state, event, to, outcome=outcome, waive=waive)

    def _fallback(self) -> bool:
        """Whether another candidate follows the current one."""
        return self.i + 1 < len(self.candidates)

    def _next_cluster(self, now: float) -> Action:
        self.i += 1
        budget = min(ATTEMPT_BEFORE_FALLBACK_S if self._fallback() else ATTEMPT_TIMEOUT_S, self.deadline - now)
        if self.i >= len(self.candidates) or budget <= MIN_BUDGET_S:
            return GiveUp(self.last, "failed")
        self.cluster, self.commit_by = self.candidates[self.i], now + budget
        self.try_no, self.ambiguous, self.state = 0, None, None
        return Record(self.cluster, self.commit_by)

    def _send(self, now: float, wait_s: float = 0.0) -> Send:
        self.try_no += 1
        timeout = max(MIN_TIMEOUT_S, min(self.commit_by, self.deadline) - now - wait_s)
        return Send(self.cluster, self.commit_by, timeout, self.try_no, wait_s)


@dataclass(frozen=True)
class Leave:
    """The resolver leaves the attempt as it is, to look again later."""
    why: str


@dataclass
class ResolveRun:
    """The resolver at one open attempt, as read from the store (`state`, `commit_by`): once
    commit_by has passed the cluster's answer is final. A session found there becomes the request's
    answer if it has none (the request failed everywhere else), else it is discarded."""

    cluster: str
    state: Attempt
    commit_by: float
    session_id: str = ""
    outcome: str = ""

    def handle(self, event, now: float):
        match event:
            case Start() if now < self.commit_by + CLOCK_SKEW_S:
                return Leave("before commit_by")  # the cluster may still make it
            case Start():
                return Ask(self.cluster, ATTEMPT_TIMEOUT_S)
            case Found(session_id=sid):
                self.session_id = sid
                return Remember(self.cluster, sid)
            case NotFound():
                return self._settle(Event.NOT_FOUND, "none")
            case NoReply():
                return Leave("no answer")
            case Remembered(winner=w) if w == self.session_id:
                return Done(None, "adopted")  # WON applied with the record
            case Remembered(winner=None):
                return Leave("held by the request's claim")  # its first attempt is not settled yet
            case Remembered(winner=w):
                return Discard(self.cluster, w)
            case Discarded(ok=True):
                return self._settle(Event.DISCARDED, "discarded")
            case Discarded(ok=False):
                return Leave("discard failed")
            case Settled(applied=True):
                return Done(None, self.outcome)
            case Settled(applied=False):
                return Leave("changed meanwhile")  # a new attempt there: decided again later
        raise IllegalAttemptChange(f"resolver: unexpected {event!r}")

    def _settle(self, event: Event, outcome: str) -> Settle:
        self.outcome = outcome
        return Settle(self.cluster, self.state, event, transition(self.state, event), self.commit_by, outcome)
