"""Exactly-once session creation at the front, under faults on the front-to-cluster link.

The real fleet (front and three clusters over gRPC on loopback) with an interceptor on the
front's channels to the clusters that, for a share of Allocate calls, fails before sending
(UNAVAILABLE), lets the cluster commit and then reports DEADLINE_EXCEEDED, or lets the cluster
commit and drops the reply. Clients retry with the same request id, some concurrently. Every
request id must end with exactly one session in all clusters together, the one the front names.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
from collections import Counter

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from provisioner.common.clock import RealClock
from provisioner.cli.serve import start_cluster, start_front
from provisioner.front.records import FrontRecords
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb
from conftest import front_channel, TIME_SCALE, fleet_config

FAULTS = ("unavailable", "deadline_after_commit", "reply_dropped")
ALLOCATE = "/provisioner.v1.ClusterService/Allocate"
EVERY_CALL = (ALLOCATE, "/provisioner.v1.ClusterService/Get", "/provisioner.v1.ClusterService/Discard")


def _error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class LinkFaults(grpc.aio.UnaryUnaryClientInterceptor):
    """Injects one of FAULTS into a share of the calls to `methods`, seeded."""

    def __init__(self, share: float, seed: int, methods=(ALLOCATE,)):
        self.share, self.rng, self.methods = share, random.Random(seed), methods
        self.injected: Counter[str] = Counter()
        self.on = True

    async def intercept_unary_unary(self, continuation, details, request):
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        fault = (self.rng.choice(FAULTS) if self.on and method in self.methods and self.rng.random() < self.share
                 else None)
        if fault is None:
            return await continuation(details, request)
        self.injected[fault] += 1
        if fault == "unavailable":
            raise _error(grpc.StatusCode.UNAVAILABLE, "injected: connection refused")
        call = await continuation(details, request)
        await call  # the cluster did the work and committed it
        if fault == "deadline_after_commit":
            raise _error(grpc.StatusCode.DEADLINE_EXCEEDED, "injected: deadline exceeded after the commit")
        raise _error(grpc.StatusCode.UNAVAILABLE, "injected: reply lost")


async def start(tmp_path, faults: grpc.aio.ClientInterceptor, tracer_provider=None):
    config = fleet_config(tmp_path)
    clock = RealClock(TIME_SCALE)
    clusters = [await start_cluster(config, c.name, clock, tmp_path / "data", address="127.0.0.1:0",
                                    tracer_provider=tracer_provider) for c in config.clusters]
    front = await start_front(config, clock, tmp_path / "data", address="127.0.0.1:0",
                              cluster_addresses={c.config.name: c.address for c in clusters},
                              link_interceptors=[faults], tracer_provider=tracer_provider)
    await front.fleet.wait_until_ready(timeout_s=10.0)
    return clusters, front


def sessions_by_request(clusters) -> Counter[str]:
    """Request id -> sessions for it, over every cluster's store (what survives a restart).
    A discarded duplicate stays on record, ended, and is not counted."""
    count: Counter[str] = Counter()
    for c in clusters:
        db = sqlite3.connect(c.store.path)
        for (body,) in db.execute("SELECT body FROM sessions"):
            s = json.loads(body)
            if s["reason"].startswith("discarded:"):
                assert s["state"] in ("stopping", "stopped"), s
            else:
                count[s["spec"]["request_id"]] += 1
        db.close()
    return count


@pytest.mark.timeout(180)
@pytest.mark.parametrize("methods", [(ALLOCATE,), EVERY_CALL], ids=["allocate-faults", "every-call-faults"])
async def test_every_request_id_yields_exactly_one_session_under_link_faults(tmp_path, methods):
    faults = LinkFaults(share=0.3, seed=11, methods=methods)
    clusters, front = await start(tmp_path, faults)
    channel = front_channel(tmp_path / "data", front.address)
    stub = s_grpc.SessionServiceStub(channel)
    regions = ("us-central1", "europe-west4", "asia-east1")
    answers: dict[str, set[str]] = {}
    failures: Counter[str] = Counter()

    async def create(i: int, rid: str) -> None:
        spec = pb.SessionSpec(request_id=rid, user_id=f"u{i % 40}", accelerator=("gpu-p100", "gpu-t4x2")[i % 2],
                              image="gpu:latest", region_hint=regions[i % 3])
        for _ in range(6):  # the client retries with the same request id until it gets an answer
            try:
                resp = await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=15)
            except grpc.aio.AioRpcError as err:
                failures[err.code().name] += 1
                await asyncio.sleep(0.05)
                continue
            answers.setdefault(rid, set()).add(resp.session.id)
            return

    gate = asyncio.Semaphore(12)

    async def one(i: int) -> None:
        async with gate:
            rid = f"chaos-{i}"
            if i % 5 == 0:  # an impatient client: two calls for the same request at once
                await asyncio.gather(create(i, rid), create(i, rid))
            else:
                await create(i, rid)

    try:
        await asyncio.gather(*(one(i) for i in range(150)))
        faults.on = False
        # Unanswered attempts are settled once their commit_by has passed.
        for _ in range(150):
            if not FrontRecords(front.store).open_attempts():
                break
            await front.placement.resolve()
            await asyncio.sleep(0.1)
        assert FrontRecords(front.store).open_attempts() == []
        print(f"faults {dict(faults.injected)}, client errors {dict(failures)}, "
              f"duplicates discarded {front.placement.discarded}, adopted {front.placement.adopted}")

        assert sum(faults.injected.values()) >= 40 and set(faults.injected) == set(FAULTS), faults.injected
        assert len(answers) == 150, f"requests never answered: {150 - len(answers)}; errors {failures}"
        assert all(len(ids) == 1 for ids in answers.values()), "one request id answered with two sessions"
        stored = sessions_by_request(clusters)
        assert {rid for rid, n in stored.items() if n > 1} == set()
        assert set(stored) == set(answers)
        # The session each client was told about is the one that exists.
        live = {s.spec.request_id: s.id for c in clusters for s in c.runtime.core.sessions.values()
                if not s.reason.startswith("discarded:")}
        assert {rid: next(iter(ids)) for rid, ids in answers.items()} == live
        if methods == (ALLOCATE,):
            # The front asks the cluster before moving on, so no duplicate was ever made.
            assert front.placement.discarded == 0
    finally:
        await channel.close()
        await front.stop(0.5)
        for c in clusters:
            await c.stop(0.5)


class DropFirstReply(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self):
        self.dropped = False

    async def intercept_unary_unary(self, continuation, details, request):
        call = await continuation(details, request)
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if method == ALLOCATE and not self.dropped:
            self.dropped = True
            await call
            raise _error(grpc.StatusCode.UNAVAILABLE, "injected: reply lost")
        return call


async def test_the_trace_of_a_create_shows_the_routing_decision_and_every_attempt(tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    clusters, front = await start(tmp_path, DropFirstReply(), provider)
    channel = front_channel(tmp_path / "data", front.address)
    try:
        spec = pb.SessionSpec(request_id="traced-1", user_id="ada", accelerator="gpu-p100", image="gpu:latest",
                              region_hint="asia-east1")
        resp = await s_grpc.SessionServiceStub(channel).CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=10)
    finally:
        await channel.close()
        await front.stop(0.5)
        for c in clusters:
            await c.stop(0.5)
    create = next(s for s in exporter.get_finished_spans()
                  if s.name == "/provisioner.v1.SessionService/CreateSession" and s.kind.name == "SERVER")
    events = [(e.name, dict(e.attributes)) for e in create.events]
    candidates = [a for name, a in events if name == "candidate"]
    assert sorted(a["cluster"] for a in candidates) == ["asia-east1", "europe-west4", "us-central1"]
    assert all({"expected_s", "how", "region_penalty_s", "load"} <= set(a) for a in candidates)
    first = candidates[0]["cluster"]
    assert first == "asia-east1"  # the user's home region: no penalty
    tries = [(name, a.get("cluster"), a.get("try")) for name, a in events if name in ("attempt", "retry", "placed")]
    # The lost reply is retried at the same cluster, which finds the session it already made.
    assert tries == [("attempt", first, 1), ("retry", first, None), ("attempt", first, 2), ("placed", first, None)]
    assert next(a for name, a in events if name == "placed")["session.id"] == resp.session.id
    assert resp.session.id.startswith(first + ".")
