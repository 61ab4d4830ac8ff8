"""The fleet as separate processes on one PostgreSQL, under a steady load of creates, while the
database is shut down for about 3 s and started again (as a restart or a failover does).

No process exits (a cluster keeps its lease through it), no call is answered UNKNOWN or with
the database's address, creates succeed again within 5 s of the database's return, and every
create acknowledged is found afterwards, once (its request id answers with the same session).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import grpc
import pytest

from conftest import front_channel
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb
from test_processes import Fleet
from test_store_outage import own_postgres  # noqa: F401  (fixture)

CLIENTS = 6
BEFORE_S = 3.0
AWAY_S = 3.0
AFTER_S = 8.0
RESUME_WITHIN_S = 5.0
STARTUP_S = 60.0  # each cluster waits out the lease's grace before it serves


async def start(fleet: Fleet, url: str) -> None:
    for s in fleet.services:
        s.argv += ["--database-url", url]
    async def one(s) -> None:
        with s.log.open("ab") as log:
            s.proc = await asyncio.create_subprocess_exec(*s.argv, stdout=asyncio.subprocess.PIPE, stderr=log)
        line = await asyncio.wait_for(s.proc.stdout.readline(), STARTUP_S)
        assert b"listening on" in line, s.log.read_text()
    await asyncio.gather(*(one(s) for s in fleet.services))
    await fleet.wait_routable(timeout=20)


@pytest.mark.timeout(240)
async def test_a_database_restart_of_3_s_under_load_is_ridden_out(tmp_path, own_postgres):  # noqa: F811
    url = own_postgres.new_database()
    fleet = Fleet(tmp_path)
    try:
        await start(fleet, url)
        async with front_channel(fleet.data_dir, fleet.front.address) as channel:
            stub = s_grpc.SessionServiceStub(channel)
            acked: dict[str, str] = {}  # request id -> session id
            done: list[tuple[float, float]] = []  # (sent, answered) of each acknowledged create
            codes: Counter[str] = Counter()
            messages: list[str] = []
            stop = asyncio.Event()

            async def client(k: int) -> None:
                n = 0
                while not stop.is_set():
                    rid, n = f"load-{k}-{n}", n + 1
                    spec = pb.SessionSpec(request_id=rid, user_id=f"user-{k}-{n}", accelerator="gpu-p100",
                                          image="gpu:latest")
                    sent = time.monotonic()
                    while True:  # a retryable failure is retried with the same request id
                        try:
                            resp = await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=10)
                        except grpc.aio.AioRpcError as err:
                            codes[err.code().name] += 1
                            messages.append(err.details() or "")
                            if not stop.is_set() and err.code() in (grpc.StatusCode.UNAVAILABLE,
                                                                    grpc.StatusCode.DEADLINE_EXCEEDED):
                                await asyncio.sleep(0.2)
                                continue
                            break
                        acked[rid] = resp.session.id
                        done.append((sent, time.monotonic()))
                        break
                    await asyncio.sleep(0.05)

            clients = [asyncio.create_task(client(k)) for k in range(CLIENTS)]
            await asyncio.sleep(BEFORE_S)
            before = len(acked)
            await asyncio.to_thread(own_postgres.pause)
            away_at = time.monotonic()
            await asyncio.sleep(AWAY_S)
            await asyncio.to_thread(own_postgres.resume)
            back_at = time.monotonic()
            await asyncio.sleep(AFTER_S)
            stop.set()
            await asyncio.gather(*clients)

            print(f"{len(acked)} creates acknowledged ({before} before the restart); the database away "
                  f"{back_at - away_at:.1f} s; failures: {dict(codes)}")
            exited = {s.log.name: s.proc.returncode for s in fleet.services if s.proc.returncode is not None}
            assert not exited, f"processes exited: {exited}"
            assert not codes.keys() - {"UNAVAILABLE", "DEADLINE_EXCEEDED"}, codes
            for text in messages:
                assert "postgresql://" not in text and str(own_postgres.port) not in text, text
            first_after = min(answered for _, answered in done if answered > back_at)
            print(f"first create answered {first_after - back_at:.2f} s after the database was back")
            assert first_after - back_at <= RESUME_WITHIN_S
            # Creates sent once the database had been back a while all succeeded, without a retry.
            late = [(sent, answered) for sent, answered in done if sent > back_at + RESUME_WITHIN_S]
            assert late and all(answered - sent < 5 for sent, answered in late)

            # Nothing acknowledged is lost, and a request id answers with its one session.
            for rid, sid in acked.items():
                user = f"user-{rid.split('-')[1]}-{int(rid.split('-')[2]) + 1}"
                spec = pb.SessionSpec(request_id=rid, user_id=user, accelerator="gpu-p100", image="gpu:latest")
                again = await stub.CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=10)
                assert again.session.id == sid, rid
                got = await stub.GetSession(s_pb.GetSessionRequest(session_id=sid), timeout=10)
                assert got.session.spec.request_id == rid
        for s in fleet.services:
            assert "Traceback" not in s.log.read_text(), s.log.read_text()[-3000:]
    finally:
        for s in fleet.services:
            await s.kill()
