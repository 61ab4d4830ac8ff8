"""The world the placement protocol's explorer plays in (tests/placement_explorer.py): model
clusters, clients, runs of the real state machine (front/attempts.py) at each front replica, the
network between them and the real store. The explorer picks each step; `steps()` lists what may
happen next and `quiesce()` lets everything settle."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from provisioner.front.attempts import (ATTEMPT_TIMEOUT_S, CLOCK_SKEW_S, Allocated, Ask, Attempt, Discard,
                                        Discarded, Done, Event, FetchWinner, Fetched, Found, GiveUp, Leave,
                                        NoReply, NotFound, PlacementRun, Record, Recorded, Refused, Remember,
                                        Remembered, ResolveRun, Send, Settle, Settled, Start, sticky_first)
from provisioner.front.records import FrontRecords

if TYPE_CHECKING:
    from placement_explorer import Scenario

KEY = "ada/r1"
DEADLINE_S = 12.0  # a client's deadline per call
TICK_S = 6.0  # past a commit_by and the skew
CALLS = 2  # a client's calls for one request: the first and a retry


class Error(Exception):
    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


# ---- the world ------------------------------------------------------------------------------

@dataclass
class ModelCluster:
    """What the protocol relies on: Allocate idempotent by request key (a discarded session keeps
    its key), nothing made for an unknown key past commit_by, Get by key."""
    name: str
    capacity: int
    by_key: dict[str, str] = field(default_factory=dict)
    discarded: set[str] = field(default_factory=set)
    made: int = 0

    def allocate(self, key: str, commit_by: float, now: float):
        if key in self.by_key:
            return self.by_key[key]
        if now > commit_by:
            return Error("ABORTED")
        if self.capacity <= 0:
            return Error("RESOURCE_EXHAUSTED")
        self.capacity -= 1
        self.made += 1
        sid = self.by_key[key] = f"{self.name}.s-{self.made}"
        return sid

    def get(self, key: str) -> str | None:
        return self.by_key.get(key)

    def discard(self, key: str) -> None:
        self.discarded.add(self.by_key[key])


@dataclass
class Run:
    """A CreateSession at a front, as front/service.py and front/placement.py carry it out."""
    client: "Client"
    front: int
    machine: PlacementRun | None = None
    action: object = None
    lookup: bool = True  # the first step: the request's recorded answer, if any
    replied: bool = False


@dataclass
class Client:
    name: str
    fronts: list[int]  # where its calls go, in turn (a retry may reach another replica)
    candidates: list[str]
    calls_left: int = CALLS
    answers: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    busy: bool = False

    @property
    def done(self) -> bool:
        return bool(self.answers) or (self.calls_left == 0 and not self.busy)


class World:
    def __init__(self, scenario: "Scenario", choose):
        self.choose = choose
        self.now = 1_000.0
        self.clusters = {name: ModelCluster(name, cap) for name, cap in scenario.capacity.items()}
        self.store = scenario.store
        self.records = FrontRecords(scenario.store)
        self.fronts = scenario.fronts
        self.clients = [Client(f"client{i}", fronts, cands) for i, (fronts, cands) in enumerate(scenario.clients)]
        self.runs: list[Run] = []
        self.resolving: dict[int, tuple[str, ResolveRun, object]] = {}
        self.in_flight: list[tuple[str, float]] = []  # Allocates delivered later: (cluster, commit_by)
        self.faults, self.ticks, self.resolves = scenario.faults, scenario.ticks, scenario.resolves
        self.freeable = {c for c, cap in scenario.capacity.items() if cap == 0} if scenario.free_capacity else set()
        self.rng = random.Random(0)
        self.edges: set[tuple[Attempt | None, Event]] = set()
        self.reply_before_record = scenario.reply_before_record
        self.later: list[tuple[int, Remember]] = []  # records of answers given first: (front, record)
        self.lost_records: list[str] = []  # such a record that found another answer recorded
        self.happened: set[str] = set()  # what the claim brings about, for the tests to see it covered

    # -- helpers

    def _attempt(self, cluster: str) -> Attempt | None:
        with self.store.reading() as cur:
            cur.execute("SELECT outcome FROM front_attempts WHERE request_id = ? AND cluster = ?", (KEY, cluster))
            row = cur.fetchone()
        return Attempt(row[0]) if row else None

    def _locked(self, front: int) -> bool:
        return any(r.front == front for r in self.runs)

    # -- the steps that may come next, each a (label, thunk)

    def steps(self) -> list[tuple[str, object]]:
        out = []
        for run in self.runs:
            out += [(f"{run.client.name}: {label}", thunk) for label, thunk in self._run_steps(run)]
        for c in self.clients:
            if not c.done and not c.busy and c.calls_left:
                front = c.fronts[(CALLS - c.calls_left) % len(c.fronts)]
                if not self._locked(front):  # one placement per request at a time in a front
                    out.append((f"{c.name}: calls front {front}", lambda c=c, f=front: self._call(c, f)))
        for i, (cluster, commit_by) in enumerate(self.in_flight):
            out.append((f"late Allocate reaches {cluster}", lambda i=i: self._deliver_late(i)))
        for i, (front, remember) in enumerate(self.later):
            out.append((f"front {front} records its answer", lambda i=i: self._record_later(i)))
        if self.faults:
            for f in range(self.fronts):
                if self._locked(f) or f in self.resolving or any(at == f for at, _ in self.later):
                    out.append((f"front {f} restarts", lambda f=f: self._restart(f)))
            for cluster in sorted(self.freeable):
                out.append((f"{cluster} frees capacity", lambda c=cluster: self._free(c)))
        if self.ticks:
            out.append(("time passes", self._tick))
        for f in range(self.fronts):
            if f in self.resolving:
                out += [(f"resolver {f}: {label}", thunk) for label, thunk in self._resolver_steps(f)]
            elif self.resolves and self._due(f):
                out.append((f"resolver {f} starts", lambda f=f: self._start_resolver(f, budget=True)))
        return out

    def _fault(self) -> None:
        self.faults -= 1

    def _call(self, client: Client, front: int) -> None:
        client.busy, client.calls_left = True, client.calls_left - 1
        self.runs.append(Run(client, front))

    def _run_steps(self, run: Run):
        if run.lookup:
            return [("looks up the request", lambda: self._lookup(run))]
        a = run.action
        match a:
            case Send():
                outs = [("Allocate answered", lambda: self._send(run, "answered"))]
                if self.faults:
                    outs += [("Allocate's reply lost", lambda: self._send(run, "reply lost")),
                             ("Allocate delayed", lambda: self._send(run, "delayed")),
                             ("Allocate delivered twice", lambda: self._send(run, "twice"))]
                return outs
            case Ask():
                outs = [("Ask answered", lambda: self._feed(run, self._ask(a.cluster)))]
                if self.faults:
                    outs.append(("Ask unanswered", lambda: (self._fault(), self._feed(run, NotFound()))))
                return outs
            case Discard():
                outs = [("Discard done", lambda: self._feed(run, self._discard(a.cluster)))]
                if self.faults:
                    outs.append(("Discard failed", lambda: (self._fault(), self._feed(run, Discarded(False)))))
                return outs
        return [(type(a).__name__, lambda: self._feed(run, self._carry_out(a)))]

    # -- a front's run

    def _lookup(self, run: Run) -> None:
        """The create's admission read: the request's answer if it has one, else where an earlier
        attempt at it may have made its session."""
        run.lookup = False
        seen = self.records.admission(KEY, 0.0, self.now)
        if seen.answer:
            run.machine, run.action = None, FetchWinner(seen.answer)
            return
        run.machine = PlacementRun(sticky_first(seen.sticky, run.client.candidates), self.now + DEADLINE_S, self.rng)
        self._advance(run, Start())

    def _feed(self, run: Run, event) -> None:
        if run.machine is None:  # the recorded answer, fetched
            assert isinstance(event, Fetched)
            return self._finish(run, Done(event.session, "known"))
        self._advance(run, event)

    def _advance(self, run: Run, event) -> None:
        action = run.machine.handle(event, self.now)
        if isinstance(action, Done) and action.then is not None:
            self.later.append((run.front, action.then))  # answered first, recorded in the background
        if isinstance(action, GiveUp) and action.outcome == "held":
            self.happened.add("held back by the claim")
        if isinstance(action, Discard) and run.machine.held:
            self.happened.add("held back, then found the claim's answer recorded")
        if isinstance(action, (Done, GiveUp)):
            return self._finish(run, action)
        if isinstance(action, Remember) and self.reply_before_record:
            run.client.answers.append(action.session_id)  # the variant: the record follows the reply
            run.replied = True
        run.action = action

    def _finish(self, run: Run, end) -> None:
        self.runs.remove(run)
        run.client.busy = False
        if isinstance(end, Done):
            if not (run.replied and end.session == run.client.answers[-1]):
                run.client.answers.append(end.session)
        else:
            run.client.errors.append(getattr(end.error, "code", "UNAVAILABLE"))

    def _send(self, run: Run, how: str) -> None:
        a: Send = run.action
        self.now += a.wait_s
        if how != "answered":
            self._fault()
        if how == "delayed":
            self.in_flight.append((a.cluster, a.commit_by))
            return self._feed(run, NoReply(Error("DEADLINE_EXCEEDED")))
        if how == "twice":
            self.in_flight.append((a.cluster, a.commit_by))
        answer = self.clusters[a.cluster].allocate(KEY, a.commit_by, self.now)
        if how == "reply lost":
            return self._feed(run, NoReply(Error("UNAVAILABLE")))
        self._feed(run, Refused(answer) if isinstance(answer, Error) else Allocated(answer, answer))

    def _ask(self, cluster: str):
        sid = self.clusters[cluster].get(KEY)
        return Found(sid, sid) if sid else NotFound()

    def _discard(self, cluster: str) -> Discarded:
        self.clusters[cluster].discard(KEY)
        return Discarded(True)

    def _carry_out(self, a):
        """The store's and the clusters' part of an action, as front/placement.py does it."""
        match a:
            case Record():
                self.edges.add((self._attempt(a.cluster), Event.SENT))
                noted = self.records.note_attempt(KEY, a.cluster, a.commit_by)
                return Recorded(noted.state, noted.first)
            case Settle():
                applied = self.records.settle_attempt(KEY, a.cluster, a.to, a.expected, a.commit_by, a.waive)
                if applied:
                    self.edges.add((a.expected, a.event))
                return Settled(applied)
            case Remember():
                self.now += a.wait_s
                before = self._attempt(a.cluster)
                winner = self.records.remember_request(KEY, a.session_id, a.cluster, self.now)
                if winner == a.session_id and before != Attempt.MADE:
                    self.edges.add((before, Event.WON))
                return Remembered(winner)
            case FetchWinner():
                sid = a.session_id or self.records.session_for_request(KEY)
                return Fetched(sid)
        raise AssertionError(f"unexpected {a!r}")

    # -- the rest of the world

    def _record_later(self, i: int) -> None:
        _, remember = self.later.pop(i)
        winner = self._carry_out(remember).winner
        if winner != remember.session_id:
            self.lost_records.append(f"answered {remember.session_id}, recorded {winner}")

    def _deliver_late(self, i: int) -> None:
        cluster, commit_by = self.in_flight.pop(i)
        self.clusters[cluster].allocate(KEY, commit_by, self.now)  # its reply goes nowhere

    def _restart(self, front: int) -> None:
        self._fault()
        for run in [r for r in self.runs if r.front == front]:
            self.runs.remove(run)
            run.client.busy = False
            run.client.errors.append("UNAVAILABLE")
        self.resolving.pop(front, None)
        if any(f == front for f, _ in self.later):
            self.happened.add("an answer's record lost to a restart")
        self.later = [(f, r) for f, r in self.later if f != front]

    def _free(self, cluster: str) -> None:
        self._fault()
        self.freeable.discard(cluster)
        self.clusters[cluster].capacity += 1

    def _tick(self) -> None:
        self.ticks -= 1
        self.now += TICK_S

    # -- a front's resolver, one open attempt at a time

    def _due(self, front: int) -> bool:
        return any(self.now >= by + CLOCK_SKEW_S for _, _, _, by in self.records.attempts_to_resolve()) \
            and not self._locked(front)

    def _start_resolver(self, front: int, budget: bool) -> bool:
        """A pass over every open attempt, in the store's order, as front/placement.py's resolve()."""
        if budget:
            self.resolves -= 1
        return self._next_attempt(front, [(c, state, by) for _, c, state, by in self.records.attempts_to_resolve()])

    def _next_attempt(self, front: int, todo: list) -> bool:
        while todo:
            cluster, state, commit_by = todo.pop(0)
            run = ResolveRun(cluster, state, commit_by)
            action = run.handle(Start(), self.now)
            if not isinstance(action, (Leave, Done)):
                self.resolving[front] = (cluster, run, action, todo)
                return True
        self.resolving.pop(front, None)
        return False

    def _resolver_steps(self, front: int):
        cluster, run, a, _ = self.resolving[front]
        match a:
            case Ask():
                outs = [("Get answered", lambda: self._resolve(front, self._ask(cluster)))]
                if self.faults:
                    outs.append(("Get unanswered", lambda: (self._fault(), self._resolve(front, NoReply(Error("UNAVAILABLE"))))))
                return outs
            case Discard():
                outs = [("Discard done", lambda: self._resolve(front, self._discard(cluster)))]
                if self.faults:
                    outs.append(("Discard failed", lambda: (self._fault(), self._resolve(front, Discarded(False)))))
                return outs
        return [(type(a).__name__, lambda: self._resolve(front, self._carry_out(a)))]

    def _resolve(self, front: int, event) -> None:
        cluster, run, _, todo = self.resolving[front]
        action = run.handle(event, self.now)
        if isinstance(action, Done) and action.outcome == "adopted":
            self.happened.add("adopted by a resolver")
        if isinstance(action, (Done, Leave)):
            self._next_attempt(front, todo)
        else:
            self.resolving[front] = (cluster, run, action, todo)

    # -- the end

    def quiesce(self) -> None:
        """No more faults: clients finish, time passes every commit_by, late Allocates land, and the
        resolvers run until nothing is open."""
        self.faults = self.ticks = self.resolves = 0
        for _ in range(200):
            steps = self.steps()
            if not steps:
                break
            steps[0][1]()
        self.now += ATTEMPT_TIMEOUT_S + DEADLINE_S + CLOCK_SKEW_S + 1
        while self.in_flight:
            self._deliver_late(0)
        for _ in range(50):
            if not self.records.attempts_to_resolve():
                break
            for f in range(self.fronts):
                if f in self.resolving or self._start_resolver(f, budget=False):
                    while f in self.resolving:
                        self._resolver_steps(f)[0][1]()
