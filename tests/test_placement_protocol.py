"""The front's placement protocol, explored: every interleaving (within bounds) of front replicas,
their resolvers, model clusters and the network, on fake time, with the real state machine
(front/attempts.py) and the real store (SQLite in memory), no sockets, no sleeps.

Faults the explorer injects at any step: a lost reply (the cluster did the Allocate), a lost or
delayed request (delivered later, after its commit_by or not), a duplicate delivery, an Ask or a
Discard that gets no answer, a front restart (its runs and locks are gone, and the records of the
answers it gave before recording them; its clients retry), capacity freed at a cluster that had
refused. Time moves in ticks the explorer places too.
At the end the world quiesces (time passes every commit_by, the network empties, each front's
resolver runs until nothing is open) and the invariant is checked: at most one session per request
key is kept, it is the recorded answer, every answer a client got names it, and every client ended
with a session or an error.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from provisioner.front.attempts import (ATTEMPT_TIMEOUT_S, CLOCK_SKEW_S, TRANSITIONS, Allocated, Ask, Attempt,
                                        Discard, Discarded, Done, Event, FetchWinner, Fetched, Found, GiveUp,
                                        IllegalTransition, Leave,
                                        NoReply, NotFound, PlacementRun, Record, Recorded, Refused, Remember,
                                        Remembered, ResolveRun, Send, Settle, Settled, Start, check_change,
                                        sticky_first, transition)
from provisioner.front.records import FrontRecords
from provisioner.store import SqliteStore

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

    def attempt(self, cluster: str) -> Attempt | None:
        with self.store.reading() as cur:
            cur.execute("SELECT outcome FROM front_attempts WHERE request_id = ? AND cluster = ?", (KEY, cluster))
            row = cur.fetchone()
        return Attempt(row[0]) if row else None

    def locked(self, front: int) -> bool:
        return any(r.front == front for r in self.runs)

    # -- the steps that may come next, each a (label, thunk)

    def steps(self) -> list[tuple[str, object]]:
        out = []
        for run in self.runs:
            out += [(f"{run.client.name}: {label}", thunk) for label, thunk in self.run_steps(run)]
        for c in self.clients:
            if not c.done and not c.busy and c.calls_left:
                front = c.fronts[(CALLS - c.calls_left) % len(c.fronts)]
                if not self.locked(front):  # one placement per request at a time in a front
                    out.append((f"{c.name}: calls front {front}", lambda c=c, f=front: self.call(c, f)))
        for i, (cluster, commit_by) in enumerate(self.in_flight):
            out.append((f"late Allocate reaches {cluster}", lambda i=i: self.deliver_late(i)))
        for i, (front, remember) in enumerate(self.later):
            out.append((f"front {front} records its answer", lambda i=i: self.record_later(i)))
        if self.faults:
            for f in range(self.fronts):
                if self.locked(f) or f in self.resolving or any(at == f for at, _ in self.later):
                    out.append((f"front {f} restarts", lambda f=f: self.restart(f)))
            for cluster in sorted(self.freeable):
                out.append((f"{cluster} frees capacity", lambda c=cluster: self.free(c)))
        if self.ticks:
            out.append(("time passes", self.tick))
        for f in range(self.fronts):
            if f in self.resolving:
                out += [(f"resolver {f}: {label}", thunk) for label, thunk in self.resolver_steps(f)]
            elif self.resolves and self.due(f):
                out.append((f"resolver {f} starts", lambda f=f: self.start_resolver(f, budget=True)))
        return out

    def fault(self) -> None:
        self.faults -= 1

    def call(self, client: Client, front: int) -> None:
        client.busy, client.calls_left = True, client.calls_left - 1
        self.runs.append(Run(client, front))

    def run_steps(self, run: Run):
        if run.lookup:
            return [("looks up the request", lambda: self.lookup(run))]
        a = run.action
        match a:
            case Send():
                outs = [("Allocate answered", lambda: self.send(run, "answered"))]
                if self.faults:
                    outs += [("Allocate's reply lost", lambda: self.send(run, "reply lost")),
                             ("Allocate delayed", lambda: self.send(run, "delayed")),
                             ("Allocate delivered twice", lambda: self.send(run, "twice"))]
                return outs
            case Ask():
                outs = [("Ask answered", lambda: self.feed(run, self.ask(a.cluster)))]
                if self.faults:
                    outs.append(("Ask unanswered", lambda: (self.fault(), self.feed(run, NotFound()))))
                return outs
            case Discard():
                outs = [("Discard done", lambda: self.feed(run, self.discard(a.cluster)))]
                if self.faults:
                    outs.append(("Discard failed", lambda: (self.fault(), self.feed(run, Discarded(False)))))
                return outs
        return [(type(a).__name__, lambda: self.feed(run, self.carry_out(a)))]

    # -- a front's run

    def lookup(self, run: Run) -> None:
        """The create's admission read: the request's answer if it has one, else where an earlier
        attempt at it may have made its session."""
        run.lookup = False
        seen = self.records.admission(KEY, 0.0, self.now)
        if seen.answer:
            run.machine, run.action = None, FetchWinner(seen.answer)
            return
        run.machine = PlacementRun(sticky_first(seen.sticky, run.client.candidates), self.now + DEADLINE_S, self.rng)
        self.advance(run, Start())

    def feed(self, run: Run, event) -> None:
        if run.machine is None:  # the recorded answer, fetched
            assert isinstance(event, Fetched)
            return self.finish(run, Done(event.session, "known"))
        self.advance(run, event)

    def advance(self, run: Run, event) -> None:
        action = run.machine.handle(event, self.now)
        if isinstance(action, Done) and action.then is not None:
            self.later.append((run.front, action.then))  # answered first, recorded in the background
        if isinstance(action, GiveUp) and action.outcome == "held":
            self.happened.add("held back by the claim")
        if isinstance(action, Discard) and run.machine.held:
            self.happened.add("held back, then found the claim's answer recorded")
        if isinstance(action, (Done, GiveUp)):
            return self.finish(run, action)
        if isinstance(action, Remember) and self.reply_before_record:
            run.client.answers.append(action.session_id)  # the variant: the record follows the reply
            run.replied = True
        run.action = action

    def finish(self, run: Run, end) -> None:
        self.runs.remove(run)
        run.client.busy = False
        if isinstance(end, Done):
            if not (run.replied and end.session == run.client.answers[-1]):
                run.client.answers.append(end.session)
        else:
            run.client.errors.append(getattr(end.error, "code", "UNAVAILABLE"))

    def send(self, run: Run, how: str) -> None:
        a: Send = run.action
        self.now += a.wait_s
        if how != "answered":
            self.fault()
        if how == "delayed":
            self.in_flight.append((a.cluster, a.commit_by))
            return self.feed(run, NoReply(Error("DEADLINE_EXCEEDED")))
        if how == "twice":
            self.in_flight.append((a.cluster, a.commit_by))
        answer = self.clusters[a.cluster].allocate(KEY, a.commit_by, self.now)
        if how == "reply lost":
            return self.feed(run, NoReply(Error("UNAVAILABLE")))
        self.feed(run, Refused(answer) if isinstance(answer, Error) else Allocated(answer, answer))

    def ask(self, cluster: str):
        sid = self.clusters[cluster].get(KEY)
        return Found(sid, sid) if sid else NotFound()

    def discard(self, cluster: str) -> Discarded:
        self.clusters[cluster].discard(KEY)
        return Discarded(True)

    def carry_out(self, a):
        """The store's and the clusters' part of an action, as front/placement.py does it."""
        match a:
            case Record():
                self.edges.add((self.attempt(a.cluster), Event.SENT))
                noted = self.records.note_attempt(KEY, a.cluster, a.commit_by)
                return Recorded(noted.state, noted.first)
            case Settle():
                applied = self.records.settle_attempt(KEY, a.cluster, a.to, a.expected, a.commit_by, a.waive)
                if applied:
                    self.edges.add((a.expected, a.event))
                return Settled(applied)
            case Remember():
                self.now += a.wait_s
                before = self.attempt(a.cluster)
                winner = self.records.remember_request(KEY, a.session_id, a.cluster, self.now)
                if winner == a.session_id and before != Attempt.MADE:
                    self.edges.add((before, Event.WON))
                return Remembered(winner)
            case FetchWinner():
                sid = a.session_id or self.records.session_for_request(KEY)
                return Fetched(sid)
        raise AssertionError(f"unexpected {a!r}")

    # -- the rest of the world

    def record_later(self, i: int) -> None:
        _, remember = self.later.pop(i)
        winner = self.carry_out(remember).winner
        if winner != remember.session_id:
            self.lost_records.append(f"answered {remember.session_id}, recorded {winner}")

    def deliver_late(self, i: int) -> None:
        cluster, commit_by = self.in_flight.pop(i)
        self.clusters[cluster].allocate(KEY, commit_by, self.now)  # its reply goes nowhere

    def restart(self, front: int) -> None:
        self.fault()
        for run in [r for r in self.runs if r.front == front]:
            self.runs.remove(run)
            run.client.busy = False
            run.client.errors.append("UNAVAILABLE")
        self.resolving.pop(front, None)
        if any(f == front for f, _ in self.later):
            self.happened.add("an answer's record lost to a restart")
        self.later = [(f, r) for f, r in self.later if f != front]

    def free(self, cluster: str) -> None:
        self.fault()
        self.freeable.discard(cluster)
        self.clusters[cluster].capacity += 1

    def tick(self) -> None:
        self.ticks -= 1
        self.now += TICK_S

    # -- a front's resolver, one open attempt at a time

    def due(self, front: int) -> bool:
        return any(self.now >= by + CLOCK_SKEW_S for _, _, _, by in self.records.attempts_to_resolve()) \
            and not self.locked(front)

    def start_resolver(self, front: int, budget: bool) -> bool:
        """A pass over every open attempt, in the store's order, as front/placement.py's resolve()."""
        if budget:
            self.resolves -= 1
        return self.next_attempt(front, [(c, state, by) for _, c, state, by in self.records.attempts_to_resolve()])

    def next_attempt(self, front: int, todo: list) -> bool:
        while todo:
            cluster, state, commit_by = todo.pop(0)
            run = ResolveRun(cluster, state, commit_by)
            action = run.handle(Start(), self.now)
            if not isinstance(action, (Leave, Done)):
                self.resolving[front] = (cluster, run, action, todo)
                return True
        self.resolving.pop(front, None)
        return False

    def resolver_steps(self, front: int):
        cluster, run, a, _ = self.resolving[front]
        match a:
            case Ask():
                outs = [("Get answered", lambda: self.resolve(front, self.ask(cluster)))]
                if self.faults:
                    outs.append(("Get unanswered", lambda: (self.fault(), self.resolve(front, NoReply(Error("UNAVAILABLE"))))))
                return outs
            case Discard():
                outs = [("Discard done", lambda: self.resolve(front, self.discard(cluster)))]
                if self.faults:
                    outs.append(("Discard failed", lambda: (self.fault(), self.resolve(front, Discarded(False)))))
                return outs
        return [(type(a).__name__, lambda: self.resolve(front, self.carry_out(a)))]

    def resolve(self, front: int, event) -> None:
        cluster, run, _, todo = self.resolving[front]
        action = run.handle(event, self.now)
        if isinstance(action, Done) and action.outcome == "adopted":
            self.happened.add("adopted by a resolver")
        if isinstance(action, (Done, Leave)):
            self.next_attempt(front, todo)
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
            self.deliver_late(0)
        for _ in range(50):
            if not self.records.attempts_to_resolve():
                break
            for f in range(self.fronts):
                if f in self.resolving or self.start_resolver(f, budget=False):
                    while f in self.resolving:
                        self.resolver_steps(f)[0][1]()


# ---- the explorer ---------------------------------------------------------------------------

@dataclass
class Scenario:
    name: str
    capacity: dict[str, int]
    clients: list[tuple[list[int], list[str]]]  # (fronts it calls, in turn; its ranked candidates)
    fronts: int = 1
    faults: int = 2
    ticks: int = 1
    resolves: int = 1
    free_capacity: bool = False
    preemptions: int = 2
    reply_before_record: bool = False  # a variant of the protocol, shown wrong below
    claims_hold: bool = True  # False: a variant whose claims hold nothing back, shown wrong below
    store: SqliteStore = None


def explore(scenario: Scenario, limit: int, extra_preemptions: int = 0) -> tuple[int, bool, set, Counter, set]:
    """Depth-first over the choices, each schedule replayed from the start; a schedule may leave a
    runnable actor for another at most `preemptions` times (bounding, as CHESS does)."""
    scenario.store = SqliteStore(":memory:")
    if not scenario.claims_hold:
        with scenario.store.transaction() as cur:
            cur.execute("DROP TRIGGER front_requests_claimed")
    prefix: list[int] = []
    schedules, edges, ends, happened = 0, set(), Counter(), set()
    while schedules < limit:
        with scenario.store.transaction() as cur:
            cur.execute("DELETE FROM front_attempts")
            cur.execute("DELETE FROM front_requests")
            cur.execute("DELETE FROM front_claims")
        taken: list[tuple[int, int]] = []  # (choice, options)
        trail: list[str] = []
        state = {"current": None, "preemptions": scenario.preemptions + extra_preemptions}

        def choose(options: list[tuple[str, object]]):
            # Staying with the actor that ran last is free; leaving it while it can go on costs one.
            actor = lambda label: label.split(":")[0]  # noqa: E731
            cur = [o for o in options if actor(o[0]) == state["current"]]
            allowed = options if state["preemptions"] or not cur else cur
            i = prefix[len(taken)] if len(taken) < len(prefix) else 0
            taken.append((i, len(allowed)))
            label, thunk = allowed[i]
            if cur and actor(label) != state["current"]:
                state["preemptions"] -= 1
            state["current"] = actor(label)
            trail.append(label)
            return thunk

        world = World(scenario, choose)
        for _ in range(60):  # until nothing can happen but what quiescence does
            options = world.steps()
            if not options:
                break
            choose(options)()
        world.quiesce()
        check(world, trail)
        schedules += 1
        edges |= world.edges
        happened |= world.happened
        ends[tuple(sorted(("answer" if c.answers else "error") for c in world.clients))] += 1
        # the next schedule: the last choice with an untried option, moved on
        while taken and taken[-1][0] + 1 >= taken[-1][1]:
            taken.pop()
        if not taken:
            scenario.store.close()
            return schedules, True, edges, ends, happened
        prefix = [c for c, _ in taken[:-1]] + [taken[-1][0] + 1]
    scenario.store.close()
    return schedules, False, edges, ends, happened


def check(world: World, trail: list[str]) -> None:
    why = "\n  ".join(trail)
    kept = [sid for c in world.clusters.values() for key, sid in c.by_key.items() if sid not in c.discarded]
    assert len(kept) <= 1, f"two sessions kept for one request: {kept}; schedule:\n  {why}"
    recorded = world.records.session_for_request(KEY)
    assert kept == ([recorded] if recorded else []), f"kept {kept}, recorded {recorded}; schedule:\n  {why}"
    for c in world.clients:
        assert all(a == recorded for a in c.answers), f"{c.name} told {c.answers}, kept {kept}:\n  {why}"
        assert c.answers or len(c.errors) == CALLS, f"{c.name} ended with neither a session nor an error:\n  {why}"
    assert world.records.open_attempts() == [], f"attempts left open: {world.records.attempts_to_resolve()}:\n  {why}"
    assert not world.lost_records, f"{world.lost_records}:\n  {why}"


SCENARIOS = [
    # One front, one client: lost replies, delayed and duplicate Allocates, restarts, a retry.
    Scenario("one front", {"c1": 1, "c2": 1}, [([0], ["c1", "c2"])], faults=2, preemptions=1),
    # A cluster that refuses, then frees capacity while a late Allocate may still land there.
    Scenario("refusal then capacity", {"c1": 0, "c2": 1}, [([0], ["c1", "c2"])], faults=2, free_capacity=True,
             preemptions=0),
    # Two front replicas placing the same request key at once, in opposite orders.
    Scenario("two replicas", {"c1": 1, "c2": 1}, [([0], ["c1", "c2"]), ([1], ["c2", "c1"])], fronts=2, faults=1,
             preemptions=1),
    # Two replicas at once without faults, with more switches between them: one is held back by the
    # other's claim, and gives up or finds that claim's answer recorded meanwhile.
    Scenario("two replicas, interleaved", {"c1": 1, "c2": 1}, [([0], ["c1", "c2"]), ([1], ["c2", "c1"])], fronts=2,
             faults=0, ticks=0, preemptions=3),
    # Two replicas ranking alike: their Allocates meet at one cluster, which refuses at first.
    Scenario("two replicas, one cluster first", {"c1": 0, "c2": 1}, [([0, 1], ["c1", "c2"]), ([1, 0], ["c1", "c2"])],
             fronts=2, faults=1, free_capacity=True, preemptions=0),
    # No capacity anywhere: clients end with errors, unless capacity freed in time makes a session
    # (the answer to a retry, or one the resolver adopts).
    Scenario("no capacity", {"c1": 0, "c2": 0}, [([0], ["c1", "c2"])], faults=2, free_capacity=True, preemptions=0),
]


@pytest.fixture(scope="module")
def explored() -> dict[str, tuple[int, bool, set, Counter]]:
    return {s.name: explore(s, limit=20_000) for s in SCENARIOS}


@pytest.mark.parametrize("name", [s.name for s in SCENARIOS])
def test_every_interleaving_keeps_at_most_one_session_and_answers_every_client(explored, name):
    schedules, complete, _, ends, _ = explored[name]
    print(f"{name}: {schedules} schedules, ends {dict(ends)}")
    assert complete and schedules > 30  # every schedule within the bounds, each checked by check()
    if name == "no capacity":
        assert set(ends) == {("answer",), ("error",)}


def test_every_edge_of_the_attempt_table_is_taken_by_some_interleaving(explored):
    taken = set().union(*(edges for _, _, edges, _, _ in explored.values()))
    assert set(TRANSITIONS) - taken == set()


def test_the_interleavings_take_the_claims_paths(explored):
    """An answer given before its record, the record lost to a restart and the session adopted by
    a resolver; a placement held back by another's claim, giving up, or waiting for its record."""
    happened = set().union(*(h for *_, h in explored.values()))
    assert happened == {"an answer's record lost to a restart", "adopted by a resolver", "held back by the claim",
                        "held back, then found the claim's answer recorded"}


@pytest.mark.long
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_interleavings_with_one_more_preemption(scenario):
    schedules, complete, _, ends, _ = explore(scenario, limit=3_000, extra_preemptions=1)
    print(f"{scenario.name}: {schedules} schedules{'' if complete else ' (the first)'}, ends {dict(ends)}")
    assert schedules > 30  # each checked by check()


def test_answering_before_the_winner_is_recorded_would_tell_two_clients_two_sessions():
    """Why a create's second durable write (the request's winner) comes before its answer: two
    placements of one request key at once (two replicas, or one front before and after a restart)
    each make a session at a different cluster; the first-writer-wins record is what makes them
    agree. Answering first and recording after, each would name its own session."""
    variant = Scenario("reply first", {"c1": 1, "c2": 1}, [([0], ["c1", "c2"]), ([1], ["c2", "c1"])], fronts=2,
                       faults=0, ticks=0, preemptions=1, reply_before_record=True)
    with pytest.raises(AssertionError, match="client. told"):
        explore(variant, limit=2_000)


def test_answering_first_is_safe_only_because_the_claim_holds_back_other_records():
    """The claim's placement answers before its record. Were another placement's session recorded
    meanwhile (the database's rule about claims taken away), two clients would hear of two."""
    variant = Scenario("claims hold nothing", {"c1": 1, "c2": 1}, [([0], ["c1", "c2"]), ([1], ["c2", "c1"])],
                       fronts=2, faults=0, ticks=0, preemptions=1, claims_hold=False)
    with pytest.raises(AssertionError, match="told|answered"):
        explore(variant, limit=2_000)


def test_the_machine_rejects_what_the_table_lacks():
    with pytest.raises(IllegalTransition):
        transition(Attempt.MADE, Event.SENT)
    with pytest.raises(IllegalTransition):
        check_change(Attempt.NONE, Attempt.MADE)
    store = SqliteStore(":memory:")
    try:
        with pytest.raises(IllegalTransition):
            FrontRecords(store).settle_attempt(KEY, "c1", Attempt.PENDING, expected=Attempt.MADE)
    finally:
        store.close()
