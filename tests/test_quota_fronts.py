"""Quotas across front replicas: the per-user lease in the shared store (SQLite and PostgreSQL),
then two front processes racing 50 creates of one user against the active-session cap."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from conftest import front_channel
from provisioner.errors import Unavailable
from provisioner.front import user_lease
from provisioner.front.user_lease import LEASE_S, UserLeases
from provisioner.store import open_store
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb
from test_processes import Fleet, Service, free_port
from test_quota import with_quotas

NOW = 1_800_000_000.0
USERS = 6


@pytest.fixture
def stores(store_url, tmp_path):
    """Two stores on one database, as two front replicas have."""
    pair = [open_store(store_url, tmp_path / "unused.db") for _ in range(2)]
    yield pair
    for s in pair:
        s.close()


def test_a_user_lease_has_one_holder_until_released(stores):
    a, b = stores
    assert a.try_user_lease("u", "front-a", NOW + LEASE_S, NOW)
    assert a.try_user_lease("u", "front-a", NOW + LEASE_S, NOW)  # a holder asking again still holds it
    assert not b.try_user_lease("u", "front-b", NOW + LEASE_S, NOW)
    assert b.try_user_lease("other", "front-b", NOW + LEASE_S, NOW)  # users are apart
    b.release_user_lease("u", "front-b")  # not b's to release
    assert not b.try_user_lease("u", "front-b", NOW + LEASE_S, NOW)
    a.release_user_lease("u", "front-a")
    assert b.try_user_lease("u", "front-b", NOW + LEASE_S, NOW)


def test_a_lease_its_holder_stopped_renewing_lapses(stores):
    a, b = stores
    assert a.try_user_lease("u", "dead", NOW + LEASE_S, NOW)
    assert not b.try_user_lease("u", "live", NOW + 2 * LEASE_S, NOW + LEASE_S - 0.1)
    assert a.renew_user_lease("u", "dead", NOW + 2 * LEASE_S)  # renewed: still held past the first expiry
    assert not b.try_user_lease("u", "live", NOW + 3 * LEASE_S, NOW + LEASE_S + 0.1)
    assert b.try_user_lease("u", "live", NOW + 4 * LEASE_S, NOW + 2 * LEASE_S + 0.1)  # lapsed: taken over
    assert not a.renew_user_lease("u", "dead", NOW + 5 * LEASE_S)  # the old holder learns it lost it


def test_one_lease_holder_among_threads(store_url, tmp_path):
    """Many processes' worth of connections asking at once: exactly one gets the lease."""
    stores = [open_store(store_url, tmp_path / "race.db") for _ in range(6)]
    won: list[str] = []
    start = threading.Barrier(len(stores))

    def ask(i: int) -> None:
        start.wait()
        if stores[i].try_user_lease("u", f"h{i}", NOW + LEASE_S, NOW):
            won.append(f"h{i}")

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert len(won) == 1


async def test_a_create_waits_a_bounded_time_for_the_lease_then_says_so(tmp_path):
    store = open_store(None, tmp_path / "front.db")
    try:
        store.try_user_lease("u", "another-front", 1e12, 0.0)
        with pytest.raises(Unavailable) as e:
            async with UserLeases(store).held("u", wait_s=0.05):
                pytest.fail("the lease was held elsewhere")
        assert "another create for user 'u'" in e.value.message and e.value.retryable
        store.release_user_lease("u", "another-front")
        leases = UserLeases(store)
        async with leases.held("u", wait_s=0.05):
            assert not store.try_user_lease("u", "another-front", 1e12, 0.0)
        await leases.flush()  # the release does not hold up the create's answer
        assert store.try_user_lease("u", "another-front", 1e12, 0.0)  # released on the way out
    finally:
        store.close()


async def test_a_held_lease_is_renewed_while_its_create_works(tmp_path, monkeypatch):
    monkeypatch.setattr(user_lease, "RENEW_EVERY_S", 0.01)
    store = open_store(None, tmp_path / "front.db")
    wall = [NOW]
    try:
        leases = UserLeases(store, wall=lambda: wall[0])
        async with leases.held("u", wait_s=1.0):
            wall[0] += LEASE_S - 1
            await asyncio.sleep(0.1)  # renewals run
            wall[0] += LEASE_S - 1  # past the expiry it was taken with
            assert not store.try_user_lease("u", "another-front", wall[0] + LEASE_S, wall[0])
        await leases.flush()
        assert store.try_user_lease("u", "another-front", wall[0] + LEASE_S, wall[0])
    finally:
        store.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.long)])
async def test_two_front_processes_admit_no_more_than_the_cap(tmp_path, database, request):
    # An odd cap: two fronts in lock-step, each making one session per round, would see 0 and 2
    # active and pass a cap of 3 together.
    with_quotas(tmp_path, max_active_sessions_per_user=3)
    fleet = Fleet(tmp_path)
    for s in (*fleet.services,):
        s.argv[s.argv.index("--clusters") + 1] = str(tmp_path / "clusters")
    if database == "postgresql":  # the fronts' store; by default one front.db in the shared data dir
        fleet.front.argv += ["--database-url", request.getfixturevalue("postgres").new_database()]
    address = f"127.0.0.1:{free_port()}"
    argv = list(fleet.front.argv)
    argv[argv.index(fleet.front.address)] = address
    second = Service(argv, address, tmp_path / "front-2.log")
    try:
        await fleet.start()
        await second.start()
        await fleet.wait_routable(second)
        channels = [front_channel(fleet.data_dir, f.address) for f in (fleet.front, second)]
        stubs = [s_grpc.SessionServiceStub(ch) for ch in channels]
        for stub in stubs:  # connected, so that both fronts get their creates at once
            await stub.GetQuota(s_pb.GetQuotaRequest(user_id="racer"), timeout=10)

        async def create(user: str, i: int):
            spec = pb.SessionSpec(request_id=f"race-{i}", user_id=user, accelerator="gpu-p100", image="gpu:latest")
            try:
                return await stubs[i % 2].CreateSession(s_pb.CreateSessionRequest(spec=spec), timeout=30)
            except grpc.aio.AioRpcError as err:
                return err.code()

        # Each user's 50 creates at once, half to each front; several users at once, for more races.
        users = [f"racer-{u}" for u in range(USERS)]
        results = await asyncio.gather(*(asyncio.gather(*(create(u, i) for i in range(50))) for u in users))
        for user, theirs in zip(users, results):
            made = [r.session for r in theirs if not isinstance(r, grpc.StatusCode)]
            refused = [r for r in theirs if isinstance(r, grpc.StatusCode)]
            print(f"{user}: {len(made)} made, {len(refused)} refused")
        for user, theirs in zip(users, results):
            made = [r.session for r in theirs if not isinstance(r, grpc.StatusCode)]
            assert {r for r in theirs if isinstance(r, grpc.StatusCode)} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            assert len(made) == 3 and len({s.id for s in made}) == 3
            listed = (await stubs[0].ListSessions(s_pb.ListSessionsRequest(user_id=user))).sessions
            assert sorted(s.id for s in listed) == sorted(s.id for s in made)
        for ch in channels:
            await ch.close()
        assert (fleet.data_dir / "front.db").exists() == (database == "sqlite")
    finally:
        await second.kill()
        for s in fleet.services:
            await s.kill()
