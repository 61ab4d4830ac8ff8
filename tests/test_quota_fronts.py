"""Quotas across front replicas: the per-user admission version in the shared store (SQLite and
PostgreSQL), then two front processes racing 50 creates of one user against the active-session cap."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import grpc
import pytest

from conftest import front_channel
from provisioner.front.attempts import Attempt
from provisioner.front.records import FrontRecords
from provisioner.store import MIGRATIONS, open_store
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import types_pb2 as pb
from test_processes import Fleet, Service, free_port
from test_quota import with_quotas

NOW = 1_800_000_000.0
WEEK = NOW - 3 * 86400.0  # when the quota week began
USERS = 6


@pytest.fixture
def stores(store_url, tmp_path):
    """Two stores on one database, as two front replicas have."""
    pair = [open_store(store_url, tmp_path / "unused.db") for _ in range(2)]
    yield pair
    for s in pair:
        s.close()


def test_the_admission_read_names_where_the_request_itself_may_have_been_made(stores):
    """A retry goes first where an earlier attempt at its own request may have made the session:
    the admission read (one statement) tells it, and only of that request's pending or unanswered
    attempts."""
    a, b = stores
    FrontRecords(b).note_attempt("u/r1", "c1", NOW)
    FrontRecords(b).note_attempt("u/r1", "c2", NOW)
    FrontRecords(b).settle_attempt("u/r1", "c2", Attempt.UNRESOLVED)
    FrontRecords(b).note_attempt("u/r1", "c3", NOW)
    FrontRecords(b).settle_attempt("u/r1", "c3", Attempt.REFUSED)
    FrontRecords(b).note_attempt("u/r2", "c4", NOW)  # another request of the user
    assert FrontRecords(a).admission("u/r1", WEEK, NOW).sticky == {"c1", "c2"}
    assert FrontRecords(a).admission("u/r3", WEEK, NOW).sticky == frozenset()


def test_an_attempt_is_recorded_only_if_the_users_admission_is_unchanged(stores):
    a, b = stores
    seen_by_a = FrontRecords(a).admission("u/r-a", WEEK, NOW)
    seen_by_b = FrontRecords(b).admission("u/r-b", WEEK, NOW)
    assert seen_by_a.version == seen_by_b.version == 0
    assert FrontRecords(b).note_attempt("u/r-b", "c1", NOW, admitted=seen_by_b.version).state is Attempt.PENDING
    assert FrontRecords(a).note_attempt("u/r-a", "c1", NOW, admitted=seen_by_a.version) is None  # b's came first
    assert FrontRecords(a).open_attempts("u/r-a") == []  # nothing written for the create that must check again
    again = FrontRecords(a).admission("u/r-a", WEEK, NOW)
    assert again.version == 1 and again.placing == {"r-b"}  # b's create counts while it is placed
    assert FrontRecords(a).note_attempt("u/r-a", "c1", NOW, admitted=again.version).state is Attempt.PENDING
    assert FrontRecords(a).note_attempt("other/r", "c1", NOW, admitted=0).state is Attempt.PENDING  # users are apart
    # Refused, not settled: not under way, but maybe made until its commit_by passes.
    FrontRecords(a).note_attempt("u/r-refused", "c1", NOW)
    FrontRecords(a).settle_attempt("u/r-refused", "c1", Attempt.REFUSED)
    seen = FrontRecords(a).admission("u/r-a", WEEK, NOW)
    assert seen.refused == {"r-refused"} and "r-refused" not in seen.placing
    # Once made, b's session is one of the user's sessions, no longer a placement under way.
    FrontRecords(b).remember_request("u/r-b", "c1.s-b", "c1", NOW - 10)
    seen = FrontRecords(a).admission("u/r-a", WEEK, NOW)
    assert seen.placing == set() and (seen.live, seen.live_s) == (1, 10.0)
    assert [(m.request_id, m.session_id) for m in FrontRecords(a).made_not_seen_ended("u")] == [("r-b", "c1.s-b")]
    assert FrontRecords(b).admission("u/r-b", WEEK, NOW).answer == "c1.s-b"


def test_the_admission_sums_up_the_weeks_sessions_made(stores):
    a, _ = stores
    for i, made_at in enumerate([WEEK - 100, WEEK - 50, WEEK + 10, NOW - 30, NOW + 5]):
        FrontRecords(a).remember_request(f"u/r{i}", f"c1.s{i}", "c1", made_at)
    FrontRecords(a).mark_ended([("u/r0", "c1.s0", WEEK - 1), ("u/r1", "c1.s1", WEEK + 5), ("u/r2", "c1.s-not-its", WEEK + 20)])
    seen = FrontRecords(a).admission("u/r-new", WEEK, NOW)
    # s0 ended before the week: nothing. s1 ran in the week from its start to its end: 5 s. Not
    # seen to end: s2 since made, s3 for 30 s, s4 (made "after now": a clock ahead) for none.
    assert seen.live == 3
    assert seen.ended_s == 5.0 and seen.live_s == (NOW - (WEEK + 10)) + 30.0
    assert {m.session_id for m in FrontRecords(a).made_not_seen_ended("u")} == {"c1.s2", "c1.s3", "c1.s4"}


def test_rows_a_front_of_the_previous_release_writes_count_for_their_user(stores):
    """During a rolling upgrade, fronts of the release before write requests and attempts without
    a user; the request key names it."""
    a, _ = stores
    with a.transaction() as cur:
        cur.execute(a.sql("INSERT INTO front_requests (request_id, session_id, cluster, created_at) "
                           "VALUES (?, ?, ?, ?)"), ("u/old-made", "c1.s-old", "c1", NOW - 10))
        cur.execute(a.sql("INSERT INTO front_attempts (request_id, cluster, commit_by, outcome) VALUES (?, ?, ?, ?)"),
                    ("u/old-placing", "c1", NOW, "pending"))
        cur.execute(a.sql("INSERT INTO front_requests (request_id, session_id, cluster, created_at) "
                           "VALUES (?, ?, ?, ?)"), ("u2/not-u", "c1.s-u2", "c1", NOW - 10))  # another user: u2
    seen = FrontRecords(a).admission("u/r-new", WEEK, NOW)
    assert (seen.live, seen.live_s, seen.placing) == (1, 10.0, {"old-placing"})
    assert [m.session_id for m in FrontRecords(a).made_not_seen_ended("u")] == ["c1.s-old"]


def test_one_admission_among_threads(store_url, tmp_path):
    """Many processes' worth of connections recording at once from one version: exactly one does."""
    stores = [open_store(store_url, tmp_path / "race.db") for _ in range(6)]
    won: list[int] = []
    start = threading.Barrier(len(stores))

    def record(i: int) -> None:
        start.wait()
        if FrontRecords(stores[i]).note_attempt(f"u/r{i}", "c1", NOW, admitted=0) is not None:
            won.append(i)

    threads = [threading.Thread(target=record, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert FrontRecords(stores[0]).admission("u/r-next", WEEK, NOW).placing == {f"r{won[0]}"}
    for s in stores:
        s.close()


def test_requests_recorded_before_they_carried_their_user_get_it(tmp_path):
    """An upgrade fills in the user of the requests and attempts already recorded."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    for version, sql in enumerate(MIGRATIONS[:8], start=1):
        db.executescript(sql)
    db.executescript("CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (8);"
                     "INSERT INTO front_requests VALUES ('u/r1', 'c1.s1', 'c1', 1.0);"
                     "INSERT INTO front_attempts VALUES ('u/r2', 'c1', 5.0, 'pending');")
    db.close()
    store = open_store(None, path)
    try:
        seen = FrontRecords(store).admission("u/r3", 0.0, 10.0)
        assert (seen.live, seen.live_s) == (1, 9.0) and seen.placing == {"r2"}
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
