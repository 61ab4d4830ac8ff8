"""The placement's shell and the request's claim: a placement whose caller went away while it
held the claim waives it, so that a retry elsewhere is not held back by a cluster that may never
answer (front/placement.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from provisioner.common.clock import RealClock
from provisioner.front.breaker import CircuitBreaker
from provisioner.front.placement import Placement
from provisioner.front.router import Candidate
from provisioner.front.records import FrontRecords
from provisioner.store import SqliteStore
from provisioner.v1 import types_pb2 as pb

KEY = "ada/r1"


def waived(store) -> list[tuple[str, str, int]]:
    with store.reading() as cur:
        cur.execute("SELECT request_id, cluster, waived FROM front_claims")
        return list(cur.fetchall())


async def test_a_placement_cancelled_while_it_holds_the_claim_waives_it(tmp_path):
    store = SqliteStore(tmp_path / "front.db")
    sent = asyncio.Event()

    async def allocate(msg, timeout=None):  # a cluster that takes the call and never answers
        sent.set()
        await asyncio.Event().wait()

    clients = {"c1": SimpleNamespace(breaker=CircuitBreaker(), sessions=SimpleNamespace(Allocate=allocate))}
    placement = Placement(clients, store, RealClock())
    spec = pb.SessionSpec(request_id="r1", user_id="ada", accelerator="gpu-p100", image="gpu:latest")
    place = asyncio.create_task(placement.place(spec, [Candidate("c1", 0.0, "warm", 0.0, 0.0)],
                                                RealClock().now() + 30, None, None, frozenset()))
    try:
        await asyncio.wait_for(sent.wait(), 10)
        assert waived(store) == [(KEY, "c1", 0)]  # it holds the claim, its Allocate under way
        place.cancel()
        await asyncio.gather(place, return_exceptions=True)
        await placement.flush()
        assert waived(store) == [(KEY, "c1", 1)]
        # A retry that made the session elsewhere records it, while c1's attempt is still open.
        FrontRecords(store).note_attempt(KEY, "c2", RealClock().now() + 5)
        assert FrontRecords(store).remember_request(KEY, "c2.s-1", "c2", 1.0) == "c2.s-1"
    finally:
        store.close()
