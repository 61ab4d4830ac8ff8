"""SIGKILL the front the moment it has answered a create, again and again, under a stream of
creates: every create it answered keeps its session, a retry of it answers that same session,
and no request keeps two sessions.

A placement that holds its request's claim answers before it records the answer (see
front/attempts.py), so a kill can land between the two. The test sees it land there (an answered
request with no record in the front's store while the front is down) and then sees the restarted
front's resolver record the session that was answered.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
import time

import grpc
import pytest

from conftest import front_channel
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb
from test_processes import CLUSTERS, Fleet

MAX_KILLS = 8
WORKERS = 6


def recorded(data_dir) -> dict[str, str]:
    """Request id -> session id, as the front's store records them (read while it is down)."""
    db = sqlite3.connect(data_dir / "front.db")
    try:
        return {key.split("/", 1)[1]: sid for key, sid in db.execute("SELECT request_id, session_id FROM front_requests")}
    finally:
        db.close()


def kept(data_dir) -> dict[str, list[str]]:
    """Request id -> the sessions kept for it over every cluster (a discarded duplicate is not)."""
    out: dict[str, list[str]] = {}
    for name in CLUSTERS:
        db = sqlite3.connect(data_dir / f"cluster-{name}.db")
        for (body,) in db.execute("SELECT body FROM sessions"):
            s = json.loads(body)
            if not s["reason"].startswith("discarded:"):
                out.setdefault(s["spec"]["request_id"], []).append(s["id"])
        db.close()
    return out


def spec(rid: str) -> pb.SessionSpec:
    # A user per request: the per-user cap on active sessions stays out of the way.
    return pb.SessionSpec(request_id=rid, user_id=f"u-{rid}", accelerator="gpu-p100", image="gpu:latest")


@pytest.mark.timeout(300)
async def test_a_front_killed_right_after_answering_loses_no_answer(tmp_path):
    fleet = Fleet(tmp_path)
    acked: dict[str, str] = {}
    in_doubt: set[str] = set()  # sent when the front died: made or not, unknown to the client
    unrecorded: set[str] = set()  # answered, not recorded when the front died
    ids = (f"r{i}" for i in itertools.count())
    try:
        await fleet.start()
        for kill in range(MAX_KILLS):
            answered = asyncio.Event()

            async def worker(stub) -> None:
                while True:
                    rid = next(ids)
                    in_doubt.add(rid)
                    try:
                        r = await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec(rid)), timeout=10)
                    except grpc.aio.AioRpcError as e:
                        assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), e
                        return  # the front is gone: this rid stays in doubt
                    in_doubt.discard(rid)
                    acked[rid] = r.session.id
                    if kill_now():
                        answered.set()

            started = time.monotonic()
            kill_now = lambda: time.monotonic() - started > 0.3  # noqa: E731 - warmed up: kill on the next answer
            async with front_channel(fleet.data_dir, fleet.front.address) as ch:
                stub = s_grpc.SessionServiceStub(ch)
                tasks = [asyncio.create_task(worker(stub)) for _ in range(WORKERS)]
                await asyncio.wait_for(answered.wait(), 30)
                await fleet.front.kill()  # SIGKILL, right after an answer reached its client
                await asyncio.gather(*tasks, return_exceptions=True)
            unrecorded |= {rid for rid, sid in acked.items() if recorded(fleet.data_dir).get(rid) != sid}
            await fleet.front.start()
            await fleet.wait_routable()
            if unrecorded and kill >= 2:
                break
        assert unrecorded, f"no kill landed between an answer and its record in {MAX_KILLS} kills"
        print(f"{kill + 1} kills, {len(acked)} answered, {len(unrecorded)} of them not recorded at a kill, "
              f"{len(in_doubt)} in doubt")

        # The restarted front's resolver records what was answered but not recorded, once its
        # commit_by has passed (before any retry of it, which would record it too).
        deadline = time.monotonic() + 30
        while {rid: recorded(fleet.data_dir).get(rid) for rid in unrecorded} != {rid: acked[rid] for rid in unrecorded}:
            assert time.monotonic() < deadline, "answered sessions were never recorded"
            await asyncio.sleep(0.5)
        async with front_channel(fleet.data_dir, fleet.front.address) as ch:
            stub = s_grpc.SessionServiceStub(ch)
            # A create in doubt, retried, makes its session once, or finds the one made.
            for rid in sorted(in_doubt):
                r = await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec(rid)), timeout=15)
                acked[rid] = r.session.id
            # Every answer stands: a retry names the same session.
            for rid, sid in acked.items():
                r = await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec(rid)), timeout=15)
                assert r.session.id == sid, (rid, sid, r.session.id)
        by_request = kept(fleet.data_dir)
        assert {rid: by_request.get(rid) for rid in acked} == {rid: [sid] for rid, sid in acked.items()}
        assert all(len(sids) == 1 for sids in by_request.values())
    finally:
        for s in fleet.services:
            await s.kill()
