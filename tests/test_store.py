"""The store, against SQLite and a real PostgreSQL server: schema, round trips, transactions,
the front's idempotency keys and attempts."""

from __future__ import annotations

import threading

import pytest

from core_driver import Driver, make_core
from provisioner.decide.events import DiscardRequested, StopRequested
from provisioner.model.records import Session, Vm
from provisioner.front.records import MADE, UNRESOLVED, FrontRecords
from provisioner.front.records import FrontRecords
from provisioner.store import MIGRATIONS, StoreError, open_store, redact


@pytest.fixture
def store(store_url, tmp_path):
    s = open_store(store_url, tmp_path / "unused.db")
    yield s
    s.close()


def some_state():
    d = Driver(make_core())
    d.advance(200)  # the pool fills
    a = d.allocate(user="ada", image="gpu:v160")
    b = d.allocate(user="bob", image="gpu:v141")
    d.advance(30)
    return d.core, a, b


def test_schema_is_at_the_latest_version_and_reopening_keeps_it(store_url, tmp_path):
    s = open_store(store_url, tmp_path / "x.db")
    assert s.schema_version == len(MIGRATIONS)
    s.close()
    again = open_store(store_url, tmp_path / "x.db")  # nothing left to migrate
    assert again.schema_version == len(MIGRATIONS)
    again.close()


def test_sessions_and_vms_round_trip(store):
    core, a, b = some_state()
    store.sessions.save(core.sessions.values(), core.vms.values())
    sessions = store.sessions.load_sessions(core.name)
    assert [s.to_dict() for s in sessions] == [s.to_dict() for s in sorted(core.sessions.values(),
                                                                          key=lambda s: (s.created_at, s.id))]
    vms = store.sessions.load_vms(core.name)
    assert {v.id for v in vms} == {v.id for v in core.vms.values() if v.state.value != "deleted"}
    assert all(isinstance(v, Vm) for v in vms) and all(isinstance(s, Session) for s in sessions)
    assert store.sessions.load_sessions("elsewhere") == [] and store.sessions.load_vms("elsewhere") == []


def test_save_updates_in_place_and_keeps_discarded_sessions(store):
    core, a, b = some_state()
    store.sessions.save(core.sessions.values(), core.vms.values())
    core.handle(StopRequested(300.0, a.id, "done"))
    discarded = core.handle(DiscardRequested(301.0, b.spec.key, "request placed elsewhere")).reply
    store.sessions.save([core.sessions[a.id], discarded], [])
    loaded = {s.id: s for s in store.sessions.load_sessions(core.name)}
    assert set(loaded) == {a.id, b.id} and loaded[a.id].state == core.sessions[a.id].state
    assert loaded[b.id].terminal or loaded[b.id].state.value == "stopping"
    assert loaded[b.id].reason == "discarded: request placed elsewhere"


def test_a_failed_batch_leaves_nothing_behind(store):
    core, a, b = some_state()

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with store.transaction() as cur:
            cur.execute(store.sql("INSERT INTO front_requests (request_id, session_id, cluster, created_at) "
                                  "VALUES (?, ?, ?, ?)"), ("r", "s", "c", 1.0))
            raise Boom()
    assert FrontRecords(store).session_for_request("r") is None
    # One bad row (a second session for one request id in one cluster) rolls back the whole batch.
    dup = Session.from_dict({**a.to_dict(), "id": "us-central1.s-other"})
    with pytest.raises(Exception):
        store.sessions.save([a, dup], list(core.vms.values()))
    assert store.sessions.load_sessions(core.name) == [] and store.sessions.load_vms(core.name) == []


def test_first_session_for_a_request_id_wins(store):
    assert FrontRecords(store).remember_request("r1", "c1.s-a", "c1", 1.0) == "c1.s-a"
    assert FrontRecords(store).remember_request("r1", "c2.s-b", "c2", 2.0) == "c1.s-a"
    assert FrontRecords(store).session_for_request("r1") == "c1.s-a" and FrontRecords(store).session_for_request("r2") is None


def test_the_winning_session_settles_its_attempt_in_the_same_write(store):
    FrontRecords(store).note_attempt("r1", "c1", 100.0)
    FrontRecords(store).note_attempt("r1", "c2", 100.0)
    assert FrontRecords(store).remember_request("r1", "c1.s-a", "c1", 1.0) == "c1.s-a"
    assert FrontRecords(store).remember_request("r1", "c2.s-b", "c2", 2.0) == "c1.s-a"
    assert FrontRecords(store).open_attempts("r1") == [("r1", "c2", 100.0)]  # the loser's stays open until discarded


async def test_reads_from_the_event_loop_see_what_group_commit_acknowledged(store):
    """What the front does: write through the writer thread, then read (PostgreSQL: in the reader
    thread) what it committed."""
    assert await store.commit(FrontRecords(store).remember_request, "r1", "c1.s-a", "c1", 1.0) == "c1.s-a"
    await store.commit(FrontRecords(store).note_attempt, "r2", "c1", 100.0)
    assert await store.read(FrontRecords(store).session_for_request, "r1") == "c1.s-a"
    assert await store.read(FrontRecords(store).session_for_request, "r2") is None
    assert await store.read(FrontRecords(store).open_attempts, "r2") == [("r2", "c1", 100.0)]


def race(store_url: str, path, write) -> list:
    """`write(store, i)` from 4 threads at once, each on its own store (a front replica) on one database."""
    stores = [open_store(store_url, path) for _ in range(4)]
    barrier = threading.Barrier(4)
    seen: list = []

    def one(i: int) -> None:
        barrier.wait()
        seen.append(write(stores[i], i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    return seen


def test_one_of_racing_first_attempts_claims_the_request(store_url, tmp_path):
    """Front replicas placing one request at once, each at its own cluster: exactly one of them
    holds the claim, so exactly one may answer before recording (see front/attempts.py)."""
    firsts = race(store_url, tmp_path / "claim.db", lambda store, i: FrontRecords(store).note_attempt("race", f"c{i}", 100.0).first)
    assert sorted(firsts) == [False, False, False, True]


def plan_of(tmp_path, run, starts: str) -> str:
    """SQLite's plan for the statement starting with `starts` that `run(store)` executes."""
    s = open_store(f"sqlite:///{tmp_path / 'plan.db'}", tmp_path / "unused.db")
    try:
        statements: list[str] = []
        s._db.set_trace_callback(statements.append)  # with its values in place
        run(s)
        s._db.set_trace_callback(None)
        return " | ".join(row[-1] for row in s.rows(f"EXPLAIN QUERY PLAN {next(q for q in statements if q.startswith(starts))}"))
    finally:
        s.close()


def test_pruning_settled_attempts_reads_only_the_old_ones(tmp_path):
    """The resolver prunes every 2 s: a range of an index by state and commit_by, not a walk of
    every attempt of the last hour."""
    plan = plan_of(tmp_path, lambda s: FrontRecords(s).prune_attempts(before=100.0), "DELETE FROM front_attempts")
    assert "front_attempts_settled (outcome=? AND commit_by<?)" in plan, plan


def test_a_users_sessions_ended_long_ago_are_read_by_when_they_ended(tmp_path):
    """A quota check lists the user's week: a range of the user's history, not all of it."""
    plan = plan_of(tmp_path, lambda s: s.sessions.load_user_ended_sessions("c1", "ada", 100.0, 200.0), "SELECT body")
    assert "sessions_user_ended (cluster=? AND user_id=? AND ended_at>? AND ended_at<?)" in plan, plan


def test_wall_clock_times_keep_their_precision(store):
    commit_by = 1_795_000_000.123  # a wall-clock deadline: a 4-byte float would round it to 128 s
    FrontRecords(store).note_attempt("r1", "c1", commit_by)
    assert FrontRecords(store).open_attempts("r1") == [("r1", "c1", commit_by)]


def test_first_writer_wins_across_threads(store_url, tmp_path):
    """Two front replicas racing to record the winner: both see the same one."""
    seen = race(store_url, tmp_path / "race.db",
                lambda store, i: FrontRecords(store).remember_request("race", f"c{i}.s-{i}", f"c{i}", float(i)))
    assert len(set(seen)) == 1 and len(seen) == 4


def test_attempts_stay_open_until_settled(store):
    FrontRecords(store).note_attempt("r1", "c1", 100.0)
    FrontRecords(store).note_attempt("r1", "c2", 105.0)
    FrontRecords(store).note_attempt("r2", "c1", 90.0)
    assert FrontRecords(store).open_attempts() == [("r2", "c1", 90.0), ("r1", "c1", 100.0), ("r1", "c2", 105.0)]
    FrontRecords(store).settle_attempt("r1", "c1", MADE)
    FrontRecords(store).settle_attempt("r1", "c2", UNRESOLVED)
    assert FrontRecords(store).open_attempts("r1") == [("r1", "c2", 105.0)]
    FrontRecords(store).note_attempt("r1", "c2", 101.0)  # a retry re-opens it, keeping the later commit_by
    assert FrontRecords(store).open_attempts("r1") == [("r1", "c2", 105.0)]
    FrontRecords(store).prune_attempts(before=200.0)  # settled ones go; open ones stay, however old
    with store.reading() as cur:
        cur.execute("SELECT request_id, cluster FROM front_attempts ORDER BY request_id, cluster")
        assert [tuple(r) for r in cur.fetchall()] == [("r1", "c2"), ("r2", "c1")]


def test_bad_urls_are_clear_errors(tmp_path):
    with pytest.raises(StoreError, match="unsupported database URL 'mysql://u:\\*\\*\\*@h/db'"):
        open_store("mysql://u:secret@h/db", tmp_path / "x.db")
    with pytest.raises(StoreError, match="cannot connect") as e:
        open_store("postgresql://u:secret@127.0.0.1:1/db", tmp_path / "x.db")
    assert "secret" not in str(e.value)
    assert redact("postgresql://u:pw@h:5432/d") == "postgresql://u:***@h:5432/d"


def test_a_newer_schema_is_refused(store_url, tmp_path):
    s = open_store(store_url, tmp_path / "x.db")
    with s.transaction() as cur:
        cur.execute(s.sql("INSERT INTO schema_version (version) VALUES (?)"), (len(MIGRATIONS) + 1,))
    s.close()
    with pytest.raises(StoreError, match="upgrade the provisioner"):
        open_store(store_url, tmp_path / "x.db")


def test_postgresql_store_reconnects_after_losing_its_connection(postgres, tmp_path):
    import psycopg

    from provisioner.store.outage import StoreUnavailable

    url = postgres.new_database()
    s = open_store(url, tmp_path / "unused.db")
    try:
        FrontRecords(s).remember_request("r1", "c1.s-a", "c1", 1.0)
        with psycopg.connect(postgres.admin_url, autocommit=True) as admin:  # as a server failover would
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND pid <> pg_backend_pid()", (url.rsplit("/", 1)[1],))
        with pytest.raises(StoreUnavailable):
            FrontRecords(s).session_for_request("r1")  # the call in flight fails (retryable, when called directly)...
        assert FrontRecords(s).session_for_request("r1") == "c1.s-a"  # ...and the next one reconnects
    finally:
        s.close()


def test_a_creates_admission_reads_two_ranges_of_the_users_requests(tmp_path):
    """Before every create: the user's requests not seen to end, and those ended this week; not
    every request the user ever made."""
    plan = plan_of(tmp_path, lambda s: FrontRecords(s).admission("ada/r1", 100.0, 200.0), "SELECT 'made'")
    assert "front_requests_user (user_id=? AND ended_at=?)" in plan, plan  # IS NULL: an equality here
    assert "front_requests_user (user_id=? AND ended_at>?)" in plan, plan
    assert "front_requests_user (user_id=?)" not in plan, plan
