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

from collections import Counter
from dataclasses import dataclass

import pytest

from placement_world import CALLS, KEY, World
from provisioner.front.attempts import TRANSITIONS, Attempt, Event, IllegalAttemptChange, check_change, transition
from provisioner.front.records import FrontRecords
from provisioner.store import SqliteStore



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
    with pytest.raises(IllegalAttemptChange):
        transition(Attempt.MADE, Event.SENT)
    with pytest.raises(IllegalAttemptChange):
        check_change(Attempt.NONE, Attempt.MADE)
    store = SqliteStore(":memory:")
    try:
        with pytest.raises(IllegalAttemptChange):
            FrontRecords(store).settle_attempt(KEY, "c1", Attempt.PENDING, expected=Attempt.MADE)
    finally:
        store.close()
