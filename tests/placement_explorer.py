"""The placement protocol's explorer (tests/test_placement_protocol.py and its long version,
tests/test_placement_protocol_long.py): depth first over every interleaving of a scenario within
bounds, in the world of tests/placement_world.py, each schedule checked when the world quiesces."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from placement_world import CALLS, KEY, World
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
