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

import pytest

from placement_explorer import SCENARIOS, Scenario, explore
from placement_world import KEY
from provisioner.front.attempts import TRANSITIONS, Attempt, Event, IllegalAttemptChange, check_change, transition
from provisioner.front.records import FrontRecords
from provisioner.store import SqliteStore


class Explorations(dict):
    """Each scenario explored once, when a test first asks for it: each test's timeout then covers
    the scenarios it reads, not all six at once."""

    def __missing__(self, name: str) -> tuple:
        self[name] = explore(next(s for s in SCENARIOS if s.name == name), limit=20_000)
        return self[name]

    def values(self) -> list[tuple]:
        return [self[s.name] for s in SCENARIOS]


@pytest.fixture(scope="module")
def explored() -> Explorations:
    return Explorations()


@pytest.mark.timeout(300)  # "two replicas" alone: 11,216 schedules, 25 s of CPU on a quiet machine
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
